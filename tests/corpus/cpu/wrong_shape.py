# reference: relu_add
# expect: incorrect
# check: shape
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return (torch.relu(x) + y)[:-1]
