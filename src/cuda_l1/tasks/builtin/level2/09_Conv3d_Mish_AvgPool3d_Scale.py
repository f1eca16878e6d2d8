"""Conv3d -> Mish -> 2x2x2 average pool -> scale on 4 volumes of 4x16x32x32."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4  # volumes
IN_CHANNELS = 4  # input channels
OUT_CHANNELS = 16  # conv output channels
DEPTH = 16  # input depth
HEIGHT = 32  # input height
WIDTH = 32  # input width
KERNEL = 3  # cubic kernel size (padding keeps the size)
SCALE = 3.0  # multiplier after pooling
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 16, "IN_CHANNELS": 16, "OUT_CHANNELS": 32, "DEPTH": 32, "HEIGHT": 64, "WIDTH": 64}


class Model(nn.Module):
    """s * avgpool3d(mish(conv3d(x)))."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, scale: float):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool3d(F.mish(self.conv(x)), 2) * self.scale


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, DEPTH, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL, SCALE]
