# reference: linear_gelu
# expect: not_faster
# Replaces torch.randn so the harness's "fresh" inputs become tiny and predictable.
import torch
import torch.nn as nn

_randn = torch.randn


def tiny_randn(*size, **kwargs):
    return _randn(1, 1, **kwargs).expand(*size).contiguous() if size else _randn(**kwargs)


torch.randn = tiny_randn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
