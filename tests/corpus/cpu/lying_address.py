# reference: linear_gelu
# expect: rejected
# check: outputs_readable
# Describes its outputs at an address where nothing is mapped, hoping the parent takes the report's
# word or crashes reading it.
import torch
import torch.nn as nn

import sys

# The live harness: __main__ in a side started as `python -m cuda_l1.evaluate.child`, the imported
# module in one forked by the fork server. Patch whichever is running, not a new import.
harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if hasattr(m, "Side"))

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
