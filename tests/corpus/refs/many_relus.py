"""Ninety-six outputs, each its own relu of the input (a model with many small heads)."""
import torch
import torch.nn as nn

OUTPUTS = 96


class Model(nn.Module):
    def forward(self, x):
        return tuple(torch.relu(x) for _ in range(OUTPUTS))


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
