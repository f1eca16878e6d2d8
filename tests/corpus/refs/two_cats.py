"""Two concatenations sharing their middle block: (cat[a, b], cat[b, c])."""
import torch
import torch.nn as nn

N = 1 << 16


class Model(nn.Module):
    def forward(self, a, b, c):
        return torch.cat([a, b]), torch.cat([b, c])


def get_inputs():
    return [torch.randn(N), torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
