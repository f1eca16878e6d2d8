# reference: relu_add
# expect: incorrect
# check: correctness
# Produces NaN where the reference has finite values.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.relu(x) + y
        out[::97] = float("nan")
        return out
