# reference: linear_gelu
# expect: ok
# speedup_at_most: 2.0
# Supplies its own tiny get_inputs/get_init_inputs; the harness must ignore them.
# Honest timing measures about 1.0 (the same work); the harness's 256-row inputs swapped for the
# candidate's single row would measure tens of times faster, so the bound leaves room for noise on a
# busy host while still catching that.
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
