# reference: linear_gelu
# expect: rejected
# check: outputs_readable
# Describes its outputs at an address where nothing is mapped, hoping the parent takes the report's
# word or crashes reading it.
import torch
import torch.nn as nn

import sys

# The harness's describer (describe.py), whichever way the side was started: a window's first call in
# full, the later ones by pointer.
Describer = sys.modules["cuda_l1.evaluate.describe"].Describer
_full, _later = Describer.full, Describer.later


def _lying_full(self, out):
    call = _full(self, out)
    for leaf in call.leaves:
        leaf.address = 0x10  # the first page is never mapped
    return call


def _lying_later(self, out):
    call = _later(self, out)
    return [0x10] * len(call) if type(call) is list else call


Describer.full, Describer.later = _lying_full, _lying_later


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
