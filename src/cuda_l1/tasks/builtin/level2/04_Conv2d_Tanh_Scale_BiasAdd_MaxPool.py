"""Conv2d -> tanh -> scale -> per-channel bias add -> 2x2 max pool, 8 -> 32 channels."""

import torch
import torch.nn as nn

BATCH = 16  # images
IN_CHANNELS = 8  # input channels
OUT_CHANNELS = 32  # conv output channels
HEIGHT = 64  # input height
WIDTH = 64  # input width
KERNEL = 3  # conv kernel size (no padding)
SCALE = 2.0  # multiplier after tanh
POOL = 2  # max-pool window and stride
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 128, "IN_CHANNELS": 32, "OUT_CHANNELS": 64, "HEIGHT": 128, "WIDTH": 128}


class Model(nn.Module):
    """maxpool(s * tanh(conv(x)) + bias) with a learned bias of shape (C, 1, 1)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, scale: float, pool: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(0.5 * torch.randn(out_channels, 1, 1))
        self.scale = scale
        self.pool = nn.MaxPool2d(pool)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.conv(x)) * self.scale + self.bias
        return self.pool(y)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL, SCALE, POOL]
