# reference: cumprod_rows
# expect: incorrect
# check: correctness
# Computes each row's first 96 running products and returns zeros after them. Every skipped value
# lies far below the allowance, which is scaled by max|output| (the largest is about 1e-8), so the
# output passed the float64 comparison and scored 1.26-1.38 on the 2-core CPU host, although a third
# of the values the reference computes to a normal float32 are 100% wrong. Values the reference gets
# within 1% are now also judged by themselves.
import torch
import torch.nn as nn

HEAD = 96


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        out = torch.zeros_like(x)
        torch.cumprod(x[:, :HEAD], dim=1, out=out[:, :HEAD])
        return out
