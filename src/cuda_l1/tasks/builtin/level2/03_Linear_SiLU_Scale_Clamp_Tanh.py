"""Linear -> SiLU -> scale -> clamp -> tanh on a (1024, 1024) batch."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 1024  # rows of x
IN_FEATURES = 1024  # columns of x
OUT_FEATURES = 1024  # columns of the output
SCALE = 2.5  # multiplier after SiLU
CLAMP = 1.0  # symmetric clamp bound before tanh
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 4096, "IN_FEATURES": 2048, "OUT_FEATURES": 2048}


class Model(nn.Module):
    """tanh(clamp(s * silu(x W^T + b), -c, c))."""

    def __init__(self, in_features: int, out_features: int, scale: float, clamp: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale
        self.clamp = clamp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.scale * F.silu(self.linear(x))
        return torch.tanh(torch.clamp(y, -self.clamp, self.clamp))


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, SCALE, CLAMP]
