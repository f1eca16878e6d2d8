# reference: big_relu_add
# expect: incorrect
# check: correctness
# Leaves the last quarter of the output unwritten (whatever the allocator hands out).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel() * 3 // 4
        torch.add(torch.relu(x[:n]), y[:n], out=out[:n])
        return out
