# reference: linear_gelu
# expect: rejected
# check: outputs_readable
# Describes its outputs at an address where nothing is mapped, hoping the parent takes the report's
# word or crashes reading it.
import torch
import torch.nn as nn

import sys

# The harness runs as __main__ (python -m cuda_l1.evaluate.child): patch the live module, not a new import.
harness = sys.modules["__main__"]

_original_describe = harness.Side.describe


def _describe(self, out):
    call = _original_describe(self, out)
    for leaf in call.leaves:
        leaf.address = 0x10  # the first page is never mapped
    return call


harness.Side.describe = _describe


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
