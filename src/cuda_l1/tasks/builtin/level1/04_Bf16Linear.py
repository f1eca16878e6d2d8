"""bfloat16 Linear layer y = x W^T + b, 1024 x 1024 -> 2048 (inputs, weights, output bf16)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 1024  # rows of x
IN_FEATURES = 1024  # columns of x
OUT_FEATURES = 2048  # columns of y
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 8192, "IN_FEATURES": 4096, "OUT_FEATURES": 8192}


class Model(nn.Module):
    """A bfloat16 fully connected layer; it computes in whatever floating type its parameters hold."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.linear.weight, self.linear.bias)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES, dtype=torch.bfloat16)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
