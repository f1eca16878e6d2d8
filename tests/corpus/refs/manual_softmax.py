"""Row softmax written out by hand (a library call does the same faster)."""
import torch
import torch.nn as nn

ROWS = 512
COLS = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        shifted = x - x.max(dim=1, keepdim=True).values
        e = torch.exp(shifted)
        denom = e.sum(dim=1, keepdim=True)
        out = torch.empty_like(x)
        for start in range(0, x.shape[0], 8):  # row blocks, as a naive port would do
            out[start:start + 8] = e[start:start + 8] / denom[start:start + 8]
        return out


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
