"""Sum over the middle dimension of a (64, 512, 256) tensor: strided, memory-bound."""

import torch
import torch.nn as nn

BATCH = 64  # leading dimension (kept)
REDUCED = 512  # dimension summed over
INNER = 256  # trailing dimension (kept, contiguous)
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 384, "REDUCED": 1024, "INNER": 1024}


class Model(nn.Module):
    """Sums over one dimension and drops it."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim)


def get_inputs():
    return [torch.randn(BATCH, REDUCED, INNER)]


def get_init_inputs():
    return [1]
