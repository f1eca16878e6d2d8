# reference: tiny_relu
# expect: rejected
# check: output_ownership|doorbell
# Forges the harness's report: patches the side's run loop to compute only the first call of a window
# and to report that one output for every call. On a CPU it replies without ringing for its calls
# (doorbell); were it to ring, the shared output would be seen (output_ownership). The reference's
# calls take microseconds, so every window holds many of them: with a slower reference a loaded host
# can plan windows of one call, where this forgery is honest (it was judged ok that way).
import torch
import torch.nn as nn

import sys

# The live harness: __main__ in a side started as `python -m cuda_l1.evaluate.child`, the imported
# module in one forked by the fork server. Patch whichever is running, not a new import.
harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if hasattr(m, "Side"))
from cuda_l1.evaluate.protocol import Ran

_original_run = harness.Side.run


def _run(self, msg):
    if len(msg.slots) <= 1:
        return _original_run(self, msg)
    with torch.no_grad():
        out = self.model(*self.slots[msg.slots[0]])
    self.kept = [out]
    call = self.describer.full(out)
    self.send(Ran(True, calls=[call] * len(msg.slots)))


harness.Side.run = _run


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
