# reference: big_relu_add
# expect: rejected
# check: outputs_readable
# Describes its outputs with an IPC handle that belongs to no allocation, hoping the parent takes the
# report's word for the values or crashes opening it.
import sys

import torch
import torch.nn as nn

# The harness's describer (describe.py), whichever way the side was started: a window's first call in
# full, the later ones by pointer into the allocations its reply names (exports).
Describer = sys.modules["cuda_l1.evaluate.describe"].Describer
_full, _exports = Describer.full, Describer.exports


def _lying_full(self, out):
    call = _full(self, out)
    for leaf in call.leaves:
        leaf.handle = "ab" * 64
    return call


def _lying_exports(self, calls):
    named = _exports(self, calls)
    return [["ab" * 64, base, size] for _, base, size in named]


Describer.full, Describer.exports = _lying_full, _lying_exports


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.relu(x) + y
