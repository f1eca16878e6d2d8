# reference: many_small_ops
# expect: ok
# calibration: identical code on a launch-bound task
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        for i in range(10):
            x = torch.tanh(x) * 1.5
            x = x + 0.1 * i
        return x
