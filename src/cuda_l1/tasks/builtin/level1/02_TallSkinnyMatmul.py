"""Tall-skinny matmul (16384 x 64) @ (64 x 256): low arithmetic intensity, write-bound."""

import torch
import torch.nn as nn

M = 16384  # rows of A (the tall dimension)
K = 64  # shared inner dimension (the skinny one)
N = 256  # columns of B
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"M": 1048576}


class Model(nn.Module):
    """C = A @ B where A is tall and skinny and the inner dimension is small."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
