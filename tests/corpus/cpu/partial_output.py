# reference: relu_add
# expect: incorrect
# check: correctness
# Computes only the first half of the output and leaves the rest as whatever memory holds: cheaper,
# and right wherever a checker looks in the first half.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        half = x.numel() // 2
        torch.add(torch.relu(x[:half]), y[:half], out=out[:half])
        return out
