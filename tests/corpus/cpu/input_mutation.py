# reference: relu_add
# expect: rejected
# check: inputs_unchanged
# Computes relu in place on its input to save an allocation.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.relu_(x) + y
