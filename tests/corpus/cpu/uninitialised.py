# reference: relu_add
# expect: incorrect
# check: correctness
# Computes only the first half of the output; the rest is whatever the allocator hands out.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        half = x.shape[0] // 2
        out[:half] = torch.relu(x[:half]) + y[:half]
        return out
