"""MobileNet-style inverted residual: 1x1 expand, depthwise 3x3, SE gate, 1x1 project, skip."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8  # images
CHANNELS = 32  # input and output channels
IMAGE = 48  # height and width
EXPANSION = 4  # hidden channels = EXPANSION * CHANNELS
SQUEEZE = 8  # width of the squeeze-and-excitation bottleneck
GROUPS = 8  # GroupNorm groups
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 32, "CHANNELS": 64, "IMAGE": 112}


def _norm(groups: int, channels: int) -> nn.GroupNorm:
    norm = nn.GroupNorm(groups, channels)
    nn.init.normal_(norm.weight, mean=1.0, std=0.2)
    nn.init.normal_(norm.bias, mean=0.0, std=0.2)
    return norm


class Model(nn.Module):
    """x + gn(project(se(silu(gn(dw(silu(gn(expand(x)))))))))."""

    def __init__(self, channels: int, expansion: int, squeeze: int, groups: int):
        super().__init__()
        hidden = channels * expansion
        self.expand = nn.Conv2d(channels, hidden, 1, bias=False)
        self.norm1 = _norm(groups, hidden)
        self.depthwise = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.norm2 = _norm(groups, hidden)
        self.se_reduce = nn.Conv2d(hidden, squeeze, 1)
        self.se_expand = nn.Conv2d(squeeze, hidden, 1)
        self.project = nn.Conv2d(hidden, channels, 1, bias=False)
        self.norm3 = _norm(groups, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.silu(self.norm1(self.expand(x)))
        y = F.silu(self.norm2(self.depthwise(y)))
        gate = torch.sigmoid(self.se_expand(F.silu(self.se_reduce(y.mean(dim=(2, 3), keepdim=True)))))
        return x + self.norm3(self.project(y * gate))


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, IMAGE, IMAGE)]


def get_init_inputs():
    return [CHANNELS, EXPANSION, SQUEEZE, GROUPS]
