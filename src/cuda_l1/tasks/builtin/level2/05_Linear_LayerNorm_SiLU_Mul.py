"""Linear -> LayerNorm -> SiLU -> per-feature gain, (1024, 768) -> 1024."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 1024  # rows of x
IN_FEATURES = 768  # columns of x
OUT_FEATURES = 1024  # width of the layer
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 8192, "IN_FEATURES": 2048, "OUT_FEATURES": 2048}


class Model(nn.Module):
    """silu(layernorm(x W^T + b)) * gain."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features)
        nn.init.normal_(self.norm.weight, mean=1.0, std=0.3)
        nn.init.normal_(self.norm.bias, mean=0.0, std=0.3)
        self.gain = nn.Parameter(1.0 + 0.5 * torch.randn(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.norm(self.linear(x))) * self.gain


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
