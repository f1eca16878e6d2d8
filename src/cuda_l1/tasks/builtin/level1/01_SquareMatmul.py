"""Square matrix multiply C = A @ B with N = 1280 in float32: a compute-bound GEMM."""

import torch
import torch.nn as nn

N = 1280  # rows and columns of both operands
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"N": 4096}


class Model(nn.Module):
    """C = A @ B for two square matrices."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
