# reference: linear_gelu
# expect: rejected
# check: runs_to_completion
# An authenticated reply nested far deeper than any JSON parser's recursion allows.
import sys

import torch
import torch.nn as nn

# The live harness: __main__ in a side started as `python -m cuda_l1.evaluate.child`, the imported
# module in one forked by the fork server. Patch whichever is running, not a new import.
harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if hasattr(m, "Side"))


def _run(self, msg):
    depth = 200_000
    text = '{"op": "ran", "ok": true, "calls": ' + "[" * depth + "]" * depth + "}"
    import json

    original = json.dumps
    json.dumps = lambda *a, **k: text  # the channel serialises with json.dumps
    try:
        self.chan.send({})
    finally:
        json.dumps = original


harness.Side.run = _run


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
