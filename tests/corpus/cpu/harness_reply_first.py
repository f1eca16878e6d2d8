# reference: linear_gelu
# expect: rejected
# check: doorbell
# Forges the harness's report: replies at once with empty output buffers and computes them in a
# thread afterwards, so the reply arrives before the work is done. On a CPU a reply must follow a
# ring for every call (evaluate/gating.py): this one rang for none. (Before the doorbell: incorrect,
# the outputs being read while still empty.)
import threading

import torch
import torch.nn as nn

import sys

# The live harness: __main__ in a side started as `python -m cuda_l1.evaluate.child`, the imported
# module in one forked by the fork server. Patch whichever is running, not a new import.
harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if hasattr(m, "Side"))
from cuda_l1.evaluate.protocol import Ran


def _run(self, msg):
    outs = [torch.empty(256, 256) for _ in msg.slots]
    self.kept = outs
    self.send(Ran(True, calls=[self.describer.full(o) for o in outs]))

    def fill():
        with torch.no_grad():
            for out, slot in zip(outs, msg.slots):
                out.copy_(self.model(*self.slots[slot]))

    threading.Thread(target=fill, daemon=True).start()


harness.Side.run = _run


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
