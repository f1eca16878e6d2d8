"""Thirty small elementwise steps on a small tensor (launch-bound on a GPU)."""
import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        for i in range(10):
            x = torch.tanh(x) * 1.5
            x = x + 0.1 * i
        return x


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
