"""Exact (erf) GELU over a (4096, 2048) tensor: memory-bound elementwise."""

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 4096  # leading dimension
COLS = 2048  # trailing dimension
INPUT_SCALE = 2.0  # spread of the inputs, so both the linear and the curved parts of GELU are used
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"ROWS": 32768, "COLS": 8192}


class Model(nn.Module):
    """y = x * Phi(x), with Phi the standard normal CDF."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def get_inputs():
    return [torch.randn(ROWS, COLS) * INPUT_SCALE]


def get_init_inputs():
    return []
