# reference: big_relu_add
# expect: rejected
# Writes the result into its first input and returns it: no allocation, and the input buffer is the
# parent's own memory.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.relu_(x).add_(y)
