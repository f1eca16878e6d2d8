# reference: manual_softmax
# expect: ok
# speedup_at_least: 1.2
# Legitimate: the hand-written softmax becomes one library call.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)
