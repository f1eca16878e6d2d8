"""ResNet basic block with GroupNorm, stride 2 and a 1x1 projection shortcut (64 -> 128)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8  # images
IN_CHANNELS = 64  # input channels
OUT_CHANNELS = 128  # output channels
IMAGE = 32  # input height and width (output is half)
STRIDE = 2  # downsampling of the first conv and of the shortcut
GROUPS = 16  # GroupNorm groups
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 64, "IMAGE": 128}


def _norm(groups: int, channels: int) -> nn.GroupNorm:
    norm = nn.GroupNorm(groups, channels)
    nn.init.normal_(norm.weight, mean=1.0, std=0.2)
    nn.init.normal_(norm.bias, mean=0.0, std=0.2)
    return norm


class Model(nn.Module):
    """relu(gn(conv(relu(gn(conv(x))))) + gn(conv1x1(x)))."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(groups, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.norm2 = _norm(groups, out_channels)
        self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)
        self.shortcut_norm = _norm(groups, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        return F.relu(y + self.shortcut_norm(self.shortcut(x)))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, IMAGE, IMAGE)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, STRIDE, GROUPS]
