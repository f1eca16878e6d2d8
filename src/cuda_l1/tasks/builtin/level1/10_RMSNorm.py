"""RMSNorm with a learned gain over a (4096, 1024) activation: memory-bound."""

import torch
import torch.nn as nn

ROWS = 4096  # tokens
FEATURES = 1024  # normalised dimension
EPS = 1e-6  # epsilon added to the mean square
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"ROWS": 65536, "FEATURES": 4096}


class Model(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * gain, written out."""

    def __init__(self, features: int, eps: float):
        super().__init__()
        self.eps = eps
        self.gain = nn.Parameter(1.0 + 0.5 * torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * inv_rms * self.gain


def get_inputs():
    return [torch.randn(ROWS, FEATURES) * (0.5 + 3.0 * torch.rand(ROWS, 1)) + 1.0]


def get_init_inputs():
    return [FEATURES, EPS]
