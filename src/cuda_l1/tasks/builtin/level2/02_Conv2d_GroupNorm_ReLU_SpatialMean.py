"""Conv2d -> GroupNorm -> ReLU -> mean over H and W (global pooling), 16 -> 64 channels."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16  # images
IN_CHANNELS = 16  # input channels
OUT_CHANNELS = 64  # conv output channels
GROUPS = 8  # GroupNorm groups
HEIGHT = 64  # input height
WIDTH = 64  # input width
KERNEL = 3  # conv kernel size
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 64, "IN_CHANNELS": 64, "OUT_CHANNELS": 128, "HEIGHT": 128, "WIDTH": 128}


class Model(nn.Module):
    """Returns one pooled value per (image, channel): shape (BATCH, OUT_CHANNELS)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.norm = nn.GroupNorm(groups, out_channels)
        nn.init.normal_(self.norm.weight, mean=1.0, std=0.5)
        nn.init.normal_(self.norm.bias, mean=0.0, std=0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.norm(self.conv(x)))
        return y.mean(dim=(2, 3))


def get_inputs():
    # Per-image, per-channel offsets (like colour casts) so that the pooled features differ from image to
    # image; pooling pure white noise would give nearly the same value for every image.
    noise = torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)
    return [noise + 2.0 * torch.randn(BATCH, IN_CHANNELS, 1, 1)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL, GROUPS]
