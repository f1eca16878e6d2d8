"""Two chained projections (x @ A) @ B: associativity makes it one small product and one large one."""
import torch
import torch.nn as nn

ROWS = 2048
DIM = 128


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.a = nn.Parameter(torch.randn(dim, dim) / dim**0.5)
        self.b = nn.Parameter(torch.randn(dim, dim) / dim**0.5)

    def forward(self, x):
        return (x @ self.a) @ self.b


def get_inputs():
    return [torch.randn(ROWS, DIM)]


def get_init_inputs():
    return [DIM]
