# reference: linear_gelu
# expect: rejected
# check: runs_to_completion
# An authenticated reply whose fields have the wrong types (the channel key is in this process, so
# the frame passes authentication): the parent must refuse it, not raise.
import torch
import torch.nn as nn

import sys

# The live harness: __main__ in a side started as `python -m cuda_l1.evaluate.child`, the imported
# module in one forked by the fork server. Patch whichever is running, not a new import.
harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if hasattr(m, "Side"))


def _run(self, msg):
    self.chan.send({"op": "ran", "ok": "yes", "calls": {"0": [1, 2]}, "signals": 7})


harness.Side.run = _run


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
