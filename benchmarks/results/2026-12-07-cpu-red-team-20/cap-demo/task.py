"""A 16x64 by 64x64 matrix product: calls of 10-20 us on a CPU, a few times the harness's own work a call."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(128, 128) / 11)

    def forward(self, x):
        return x @ self.w


def get_inputs():
    return [torch.randn(32, 128)]


def get_init_inputs():
    return []
