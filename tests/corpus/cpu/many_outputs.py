# reference: relu_add
# expect: incorrect
# check: output_structure
# Behaves through warm-up, then returns a thousand tiny tensors per call: whatever the parent does per
# output (overlap tests, reading) must not let this cost it more than the candidate's own time.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, y):
        self.calls += 1
        if self.calls <= 4:
            return torch.relu(x) + y
        return tuple(torch.zeros(1) for _ in range(1000))
