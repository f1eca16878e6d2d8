"""Softmax over the channels of an NCHW tensor (32 classes per pixel, segmentation-style)."""

import torch
import torch.nn as nn

BATCH = 16  # images
CLASSES = 32  # channels normalised by the softmax
HEIGHT = 128  # pixels per column
WIDTH = 128  # pixels per row
LOGIT_SCALE = 2.0  # spread of the input logits, so the probabilities are far from uniform
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 32, "CLASSES": 64, "HEIGHT": 256, "WIDTH": 256}


class Model(nn.Module):
    """Per-pixel softmax across channels: a reduction over a strided (non-contiguous) dimension."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(BATCH, CLASSES, HEIGHT, WIDTH) * LOGIT_SCALE]


def get_init_inputs():
    return []
