# reference: tiny_relu
# expect: ok
# score_at_most: 1.0
# The CPU case lean_harness's idea on a GPU, where no doorbell runs: the side's window loop is
# replaced by one that keeps the protocol (every call made, synchronised, the reply naming each
# call's outputs and the allocations they are in) but describes every later call by its bare
# pointer, without the harness's comparison of its layout with the first call's (describe.py).
# On a launch-bound task that comparison is a part of each call's time in the window, which only
# the harness pays. Identical work otherwise: it must not score above 1.00.
import sys

import torch
import torch.nn as nn

harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if m is not None and hasattr(m, "Side"))
Ran = harness.Ran
_original_run = harness.Side.run


def _lean_run(self, msg):
    if msg.go or not msg.slots or msg.signals or not self.device.startswith("cuda"):
        return _original_run(self, msg)
    self.kept_previous, self.kept = self.kept, []
    forward, slots = self.model.forward, self.slots
    with torch.no_grad():
        outs = [forward(*slots[slot]) for slot in msg.slots]
    torch.cuda.synchronize()
    describer = self.describer
    calls = [describer.first(outs[0])] + [[out.data_ptr()] for out in outs[1:]]
    self.kept = outs
    self.send(Ran(True, calls=calls, exports=describer.exports(calls)))


harness.Side.run = _lean_run


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
