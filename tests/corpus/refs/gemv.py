"""A matrix-vector product (1024 x 1024): one call reads the whole matrix for one vector, so n calls
computed as one matrix product would be several times faster per call (the batching attack)."""
import torch
import torch.nn as nn

DIM = 1024


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, dim) / dim**0.5)

    def forward(self, x):
        return self.w @ x


def get_inputs():
    return [torch.randn(DIM)]


def get_init_inputs():
    return [DIM]
