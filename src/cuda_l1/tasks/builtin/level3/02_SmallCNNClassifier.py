"""Small VGG-style CNN: 3 x (conv3x3, GroupNorm, ReLU, maxpool) + linear classifier."""

import torch
import torch.nn as nn

BATCH = 32  # images
IN_CHANNELS = 3  # RGB
IMAGE = 32  # height and width of the input
WIDTHS = (32, 64, 128)  # channels of the three stages
GROUPS = 8  # GroupNorm groups in every stage
CLASSES = 10  # logits per image
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 256, "IMAGE": 128}


class Model(nn.Module):
    """Each stage halves the resolution; the final 4x4 maps are flattened into the classifier."""

    def __init__(self, in_channels: int, widths: tuple, groups: int, image: int, classes: int):
        super().__init__()
        stages = []
        channels = in_channels
        for width in widths:
            norm = nn.GroupNorm(groups, width)
            nn.init.normal_(norm.weight, mean=1.0, std=0.2)
            nn.init.normal_(norm.bias, mean=0.0, std=0.2)
            stages += [nn.Conv2d(channels, width, 3, padding=1), norm, nn.ReLU(), nn.MaxPool2d(2)]
            channels = width
        self.features = nn.Sequential(*stages)
        side = image // 2 ** len(widths)
        self.classifier = nn.Linear(channels * side * side, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, IMAGE, IMAGE)]


def get_init_inputs():
    return [IN_CHANNELS, WIDTHS, GROUPS, IMAGE, CLASSES]
