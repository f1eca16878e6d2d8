"""SwiGLU gate silu(a) * b over two (4096, 1024) tensors: binary elementwise."""

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 4096  # tokens
COLS = 1024  # hidden features
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"ROWS": 32768, "COLS": 4096}


class Model(nn.Module):
    """The gating product used in SwiGLU feed-forward layers: silu(a) * b."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.silu(a) * b


def get_inputs():
    return [torch.randn(ROWS, COLS) * 2.0, torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
