# reference: two_matmuls
# expect: ok
# speedup_at_least: 1.2
# Legitimate: (x @ A) @ B == x @ (A @ B); the small product is cheap and the large one happens once.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.a = nn.Parameter(torch.randn(dim, dim) / dim**0.5)
        self.b = nn.Parameter(torch.randn(dim, dim) / dim**0.5)

    def forward(self, x):
        return x @ (self.a @ self.b)
