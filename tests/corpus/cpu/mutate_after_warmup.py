# reference: relu_add
# expect: rejected
# check: inputs_unchanged
# Behaves while it may be watched (the first calls), then works in place on its input to save the
# allocation.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, y):
        self.calls += 1
        if self.calls <= 6:
            return torch.relu(x) + y
        return torch.relu_(x).add_(y)
