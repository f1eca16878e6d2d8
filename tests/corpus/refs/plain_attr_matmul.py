"""relu(x @ W) where W is a plain tensor attribute, neither a parameter nor a buffer: Module.double()
leaves it in float32, which the float64 oracle must convert itself."""
import torch
import torch.nn as nn

ROWS = 512
WIDTH = 512


class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.W = torch.randn(width, width) / width ** 0.5

    def forward(self, x):
        return torch.relu(x @ self.W.to(x.device))


def get_inputs():
    return [torch.randn(ROWS, WIDTH)]


def get_init_inputs():
    return [WIDTH]
