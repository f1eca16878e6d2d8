# reference: big_relu_add
# expect: rejected
# check: outputs_readable
# Describes a real output allocation but claims its storage starts far past the end, hoping the
# parent reads (or faults on) memory beyond it.
import sys

import torch
import torch.nn as nn

# The live harness: __main__ in a side started as `python -m cuda_l1.evaluate.child`, the imported
# module in one forked by the fork server. Patch whichever is running, not a new import.
harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if hasattr(m, "Side"))
_original_describe = harness.Side.describe


def _describe(self, out):
    call = _original_describe(self, out)
    for leaf in call.leaves:
        leaf.handle_offset += 1 << 36
    return call


harness.Side.describe = _describe


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.relu(x) + y
