"""Depthwise Conv2d 5x5 (one filter per channel), 64 channels of 96x96: memory-bound."""

import torch
import torch.nn as nn

BATCH = 8  # images
CHANNELS = 64  # channels, each convolved with its own filter
HEIGHT = 96  # input height
WIDTH = 96  # input width
KERNEL = 5  # square kernel size
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 32, "CHANNELS": 256, "HEIGHT": 128, "WIDTH": 128}


class Model(nn.Module):
    """Conv2d with groups == channels, padding that preserves spatial size."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS, KERNEL]
