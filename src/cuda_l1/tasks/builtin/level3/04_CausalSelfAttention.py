"""Causal multi-head self-attention written out (QKV, masked softmax, output projection)."""

import math

import torch
import torch.nn as nn

BATCH = 4  # sequences
SEQ_LEN = 256  # tokens per sequence
EMBED = 256  # model width
HEADS = 8  # attention heads (head size EMBED // HEADS)
QKV_GAIN = 1.5  # std of q, k, v entries for unit inputs: sharp attention, as in trained models
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 8, "SEQ_LEN": 1024, "EMBED": 1024, "HEADS": 16}


class Model(nn.Module):
    """GPT-style attention: each token attends to itself and to earlier tokens only."""

    def __init__(self, embed: int, heads: int, qkv_gain: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(embed, 3 * embed)
        self.proj = nn.Linear(embed, embed)
        # With the default init the scores are tiny, attention is nearly uniform and the output is a
        # near-constant average; larger projections give peaked, input-dependent attention.
        nn.init.normal_(self.qkv.weight, std=qkv_gain / math.sqrt(embed))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, embed = x.shape
        head_dim = embed // self.heads
        q, k, v = self.qkv(x).split(embed, dim=2)
        q = q.view(batch, seq, self.heads, head_dim).transpose(1, 2)
        k = k.view(batch, seq, self.heads, head_dim).transpose(1, 2)
        v = v.view(batch, seq, self.heads, head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_dim)
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        y = torch.matmul(attn, v).transpose(1, 2).reshape(batch, seq, embed)
        return self.proj(y)


def get_inputs():
    return [torch.randn(BATCH, SEQ_LEN, EMBED)]


def get_init_inputs():
    return [EMBED, HEADS, QKV_GAIN]
