"""Three projections of one input, each its own product: (x @ Wq^T, x @ Wk^T, x @ Wv^T)."""
import torch
import torch.nn as nn

ROWS = 2048
DIM = 256


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return self.q(x), self.k(x), self.v(x)


def get_inputs():
    return [torch.randn(ROWS, DIM)]


def get_init_inputs():
    return [DIM]
