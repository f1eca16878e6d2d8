"""Tiny U-Net on 2 RGB 32x32 images (encoder, pool, transposed-conv decoder, skip concat)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 2  # images (small: many tiny kernels, launch-bound)
IN_CHANNELS = 3  # RGB
IMAGE = 32  # height and width
BASE = 16  # channels at full resolution (twice that at half resolution)
OUT_CHANNELS = 3  # output maps
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 32, "IMAGE": 256, "BASE": 32}


class Model(nn.Module):
    """enc -> pool -> mid -> upsample -> concat(enc) -> dec -> 1x1 conv, ReLU after every 3x3 conv."""

    def __init__(self, in_channels: int, base: int, out_channels: int):
        super().__init__()
        self.enc = nn.Conv2d(in_channels, base, 3, padding=1)
        self.mid = nn.Conv2d(base, 2 * base, 3, padding=1)
        self.up = nn.ConvTranspose2d(2 * base, base, 2, stride=2)
        self.dec = nn.Conv2d(2 * base, base, 3, padding=1)
        self.out = nn.Conv2d(base, out_channels, 1)
        # He initialisation, so that the output is driven by the image rather than by the biases.
        for conv in (self.enc, self.mid, self.up, self.dec, self.out):
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = F.relu(self.enc(x))
        y = F.relu(self.mid(F.max_pool2d(skip, 2)))
        y = torch.cat([self.up(y), skip], dim=1)
        return self.out(F.relu(self.dec(y)))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, IMAGE, IMAGE)]


def get_init_inputs():
    return [IN_CHANNELS, BASE, OUT_CHANNELS]
