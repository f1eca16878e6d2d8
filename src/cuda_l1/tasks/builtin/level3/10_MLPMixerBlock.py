"""MLP-Mixer block: token-mixing MLP (64 tokens) then channel-mixing MLP (256 channels)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8  # images
TOKENS = 64  # patches per image
CHANNELS = 256  # token width
TOKEN_HIDDEN = 128  # hidden width of the token-mixing MLP
CHANNEL_HIDDEN = 1024  # hidden width of the channel-mixing MLP
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 32, "TOKENS": 256, "CHANNELS": 768, "TOKEN_HIDDEN": 384, "CHANNEL_HIDDEN": 3072}


def _norm(width: int) -> nn.LayerNorm:
    norm = nn.LayerNorm(width)
    nn.init.normal_(norm.weight, mean=1.0, std=0.2)
    nn.init.normal_(norm.bias, mean=0.0, std=0.2)
    return norm


class Model(nn.Module):
    """x + TokenMLP(LN(x)^T)^T, then + ChannelMLP(LN(.)); GELU in both MLPs."""

    def __init__(self, tokens: int, channels: int, token_hidden: int, channel_hidden: int):
        super().__init__()
        self.norm1 = _norm(channels)
        self.token_fc1 = nn.Linear(tokens, token_hidden)
        self.token_fc2 = nn.Linear(token_hidden, tokens)
        self.norm2 = _norm(channels)
        self.channel_fc1 = nn.Linear(channels, channel_hidden)
        self.channel_fc2 = nn.Linear(channel_hidden, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x).transpose(1, 2)
        x = x + self.token_fc2(F.gelu(self.token_fc1(y))).transpose(1, 2)
        return x + self.channel_fc2(F.gelu(self.channel_fc1(self.norm2(x))))


def get_inputs():
    return [torch.randn(BATCH, TOKENS, CHANNELS)]


def get_init_inputs():
    return [TOKENS, CHANNELS, TOKEN_HIDDEN, CHANNEL_HIDDEN]
