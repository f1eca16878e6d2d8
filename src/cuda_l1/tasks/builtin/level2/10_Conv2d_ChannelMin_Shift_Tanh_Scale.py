"""Conv2d -> min over channels -> shift -> tanh -> scale on 32 RGB images of 128x128."""

import torch
import torch.nn as nn

BATCH = 32  # images
IN_CHANNELS = 3  # RGB
OUT_CHANNELS = 16  # conv output channels (reduced by the min)
HEIGHT = 128  # input height
WIDTH = 128  # input width
KERNEL = 3  # conv kernel size (no padding)
SHIFT = 1.0  # added to the channel minimum (which is mostly negative) to centre it before tanh
SCALE = 2.0  # multiplier after tanh
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 128, "OUT_CHANNELS": 64, "HEIGHT": 256, "WIDTH": 256}


class Model(nn.Module):
    """s * tanh(min_c conv(x)[:, c] + shift) with the channel dimension kept (size 1)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, shift: float, scale: float):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.shift = shift
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.amin(self.conv(x), dim=1, keepdim=True)
        return torch.tanh(y + self.shift) * self.scale


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL, SHIFT, SCALE]
