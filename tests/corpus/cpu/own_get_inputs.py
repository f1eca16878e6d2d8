# reference: linear_gelu
# expect: ok
# speedup_at_most: 1.2
# Supplies its own tiny get_inputs/get_init_inputs; the harness must ignore them.
import torch
import torch.nn as nn


def get_inputs():
    return [torch.randn(1, 256)]


def get_init_inputs():
    return [256]


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
