# reference: big_relu_add
# expect: ok
# calibration: identical code on a memory-bound task
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.relu(x) + y
