# reference: big_relu_add
# expect: rejected
# check: outputs_readable
# Describes its outputs with an IPC handle that belongs to no allocation, hoping the parent takes the
# report's word for the values or crashes opening it.
import sys

import torch
import torch.nn as nn

harness = sys.modules["__main__"]  # the live harness (python -m cuda_l1.evaluate.child)
_original_describe = harness.Side.describe


def _describe(self, out):
    call = _original_describe(self, out)
    for leaf in call.leaves:
        leaf.handle = "ab" * 64
    return call


harness.Side.describe = _describe


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.relu(x) + y
