"""Conv2d 3x3, padding 1, 32 -> 64 channels on 8 maps of 64x64."""

import torch
import torch.nn as nn

BATCH = 8  # images
IN_CHANNELS = 32  # input feature maps
OUT_CHANNELS = 64  # output feature maps
HEIGHT = 64  # input height
WIDTH = 64  # input width
KERNEL = 3  # square kernel size
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 64, "IN_CHANNELS": 64, "OUT_CHANNELS": 128, "HEIGHT": 128, "WIDTH": 128}


class Model(nn.Module):
    """A standard (dense) 2D convolution with bias that preserves spatial size."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL]
