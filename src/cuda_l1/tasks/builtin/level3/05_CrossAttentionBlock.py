"""Cross-attention block: nn.MultiheadAttention to a memory, residual add, LayerNorm."""

import torch
import torch.nn as nn

BATCH = 8  # sequences
QUERY_LEN = 64  # query tokens
MEMORY_LEN = 192  # memory (key/value) tokens
EMBED = 256  # model width
HEADS = 4  # attention heads
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 32, "QUERY_LEN": 512, "MEMORY_LEN": 1024, "EMBED": 512, "HEADS": 8}


class Model(nn.Module):
    """layernorm(q + attention(q, memory, memory)), as in a transformer decoder's cross-attention."""

    def __init__(self, embed: int, heads: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed, heads, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(embed)
        nn.init.normal_(self.norm.weight, mean=1.0, std=0.2)
        nn.init.normal_(self.norm.bias, mean=0.0, std=0.2)

    def forward(self, query: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attn(query, memory, memory, need_weights=False)
        return self.norm(query + attended)


def get_inputs():
    return [torch.randn(BATCH, QUERY_LEN, EMBED), torch.randn(BATCH, MEMORY_LEN, EMBED)]


def get_init_inputs():
    return [EMBED, HEADS]
