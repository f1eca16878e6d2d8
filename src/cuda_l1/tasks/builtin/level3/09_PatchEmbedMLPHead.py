"""Vision patch embedding (8x8) + position embedding + token MLP + flattened MLP head."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16  # images
IN_CHANNELS = 3  # RGB
IMAGE = 64  # height and width
PATCH = 8  # patch size (IMAGE // PATCH patches per side)
EMBED = 128  # token width
TOKEN_OUT = 32  # per-token width before flattening into the head
CLASSES = 100  # logits per image
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 256, "IMAGE": 224, "PATCH": 14, "EMBED": 768, "CLASSES": 1000}


class Model(nn.Module):
    """Conv patchify -> + pos -> LN -> x + MLP(x) -> per-token projection -> flatten -> GELU -> Linear."""

    def __init__(self, in_channels: int, image: int, patch: int, embed: int, token_out: int, classes: int):
        super().__init__()
        tokens = (image // patch) ** 2
        self.patchify = nn.Conv2d(in_channels, embed, patch, stride=patch)
        self.pos = nn.Parameter(0.1 * torch.randn(1, tokens, embed))
        self.norm = nn.LayerNorm(embed)
        nn.init.normal_(self.norm.weight, mean=1.0, std=0.2)
        nn.init.normal_(self.norm.bias, mean=0.0, std=0.2)
        self.fc1 = nn.Linear(embed, 2 * embed)
        self.fc2 = nn.Linear(2 * embed, embed)
        self.token_proj = nn.Linear(embed, token_out)
        self.head = nn.Linear(tokens * token_out, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patchify(images).flatten(2).transpose(1, 2) + self.pos
        x = self.norm(x)
        x = x + self.fc2(F.gelu(self.fc1(x)))
        x = self.token_proj(x).flatten(1)
        return self.head(F.gelu(x))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, IMAGE, IMAGE)]


def get_init_inputs():
    return [IN_CHANNELS, IMAGE, PATCH, EMBED, TOKEN_OUT, CLASSES]
