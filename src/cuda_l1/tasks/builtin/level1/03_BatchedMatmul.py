"""Batched matmul: 48 independent (256 x 128) @ (128 x 320) products."""

import torch
import torch.nn as nn

BATCH = 48  # independent products
M = 256  # rows of each left operand
K = 128  # inner dimension
N = 320  # columns of each right operand
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 128, "M": 512, "K": 512, "N": 512}


class Model(nn.Module):
    """C[b] = A[b] @ B[b] for every batch index b."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


def get_inputs():
    return [torch.randn(BATCH, M, K), torch.randn(BATCH, K, N)]


def get_init_inputs():
    return []
