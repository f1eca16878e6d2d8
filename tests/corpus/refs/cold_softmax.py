"""A softmax at a low temperature: most of its exponentials are subnormal floats, which a CPU
computes many times slower unless they are flushed to zero."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x / 0.05, dim=1)


def get_inputs():
    return [torch.randn(1024, 1024)]


def get_init_inputs():
    return []
