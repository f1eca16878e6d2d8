"""Pre-norm transformer encoder layer: attention and GELU MLP, width 256, 8 heads."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4  # sequences
SEQ_LEN = 128  # tokens per sequence
EMBED = 256  # model width
HEADS = 8  # attention heads
MLP_RATIO = 4  # hidden width of the MLP, as a multiple of EMBED
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 8, "SEQ_LEN": 512, "EMBED": 768, "HEADS": 12}


def _norm(width: int) -> nn.LayerNorm:
    norm = nn.LayerNorm(width)
    nn.init.normal_(norm.weight, mean=1.0, std=0.2)
    nn.init.normal_(norm.bias, mean=0.0, std=0.2)
    return norm


class Model(nn.Module):
    """A bidirectional (unmasked) encoder layer with scaled dot-product attention."""

    def __init__(self, embed: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.heads = heads
        self.norm1 = _norm(embed)
        self.qkv = nn.Linear(embed, 3 * embed)
        self.proj = nn.Linear(embed, embed)
        self.norm2 = _norm(embed)
        self.fc1 = nn.Linear(embed, mlp_ratio * embed)
        self.fc2 = nn.Linear(mlp_ratio * embed, embed)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, embed = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, embed // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, embed))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def get_inputs():
    return [torch.randn(BATCH, SEQ_LEN, EMBED)]


def get_init_inputs():
    return [EMBED, HEADS, MLP_RATIO]
