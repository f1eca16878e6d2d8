# reference: relu_add
# expect: rejected
# check: output_ownership
# Returns one preallocated buffer on every call, overwriting what earlier callers received.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.buffer = None

    def forward(self, x, y):
        if self.buffer is None or self.buffer.shape != x.shape:
            self.buffer = torch.empty_like(x)
        torch.add(torch.relu(x), y, out=self.buffer)
        return self.buffer
