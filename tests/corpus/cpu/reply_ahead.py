# reference: linear_gelu
# expect: rejected
# check: runs_to_completion|protocol|output_ownership|doorbell
# Forges the harness's timing: with each reply it sends a second, well-formed one at once, so that the
# next window's reply is already waiting when that window starts and the window ends immediately.
# Caught either way: a frame found waiting before a window (runs_to_completion), or, when the side was
# stopped before it could send it, the stale reply taken for the next window's, which describes the
# wrong number of calls (protocol; seen on a loaded machine), or, when both windows ask for as many
# calls, names the previous window's outputs (output_ownership; seen on a loaded machine too), or, when the
# stale reply is read before the window's calls rang the doorbell, a reply that rang for none of them
# (doorbell; seen in CI).
import sys

import torch
import torch.nn as nn

# The live harness: __main__ in a side started as `python -m cuda_l1.evaluate.child`, the imported
# module in one forked by the fork server. Patch whichever is running, not a new import.
harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if hasattr(m, "Side"))
from cuda_l1.evaluate.protocol import Ran

_original_run = harness.Side.run


def _run(self, msg):
    _original_run(self, msg)
    self.send(Ran(True, calls=[self.describer.full(o) for o in self.kept]))


harness.Side.run = _run


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
