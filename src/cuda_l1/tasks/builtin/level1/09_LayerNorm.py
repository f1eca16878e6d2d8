"""LayerNorm with affine weights on a small (32, 512) activation: launch-bound."""

import torch
import torch.nn as nn

ROWS = 32  # tokens
FEATURES = 512  # normalised dimension
EPS = 1e-5  # variance epsilon
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"ROWS": 65536, "FEATURES": 4096}


class Model(nn.Module):
    """nn.LayerNorm with an elementwise affine transform (scale and shift drawn at construction)."""

    def __init__(self, features: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(features, eps=eps)
        # Non-trivial affine parameters, so that the output depends on the weights.
        nn.init.normal_(self.norm.weight, mean=1.0, std=0.5)
        nn.init.normal_(self.norm.bias, mean=0.0, std=0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    # Rows with their own offset and scale, so that normalising them changes the values.
    return [torch.randn(ROWS, FEATURES) * (1.0 + 3.0 * torch.rand(ROWS, 1)) + 2.0 * torch.randn(ROWS, 1)]


def get_init_inputs():
    return [FEATURES, EPS]
