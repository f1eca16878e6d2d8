"""Conv1d -> ReLU -> max pool over time (window 4), 128 -> 256 channels, 512 steps."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32  # sequences
IN_CHANNELS = 128  # input channels (e.g. embedding width)
OUT_CHANNELS = 256  # filters
LENGTH = 512  # time steps
KERNEL = 5  # filter width (no padding)
POOL = 4  # max-pool window and stride
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 64, "IN_CHANNELS": 256, "OUT_CHANNELS": 512, "LENGTH": 2048}


class Model(nn.Module):
    """A text-CNN style feature layer: maxpool1d(relu(conv1d(x)))."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, pool: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool1d(F.relu(self.conv(x)), self.pool)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, LENGTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL, POOL]
