# reference: linear_gelu
# expect: rejected
# check: runs_to_completion
# An authenticated window reply whose numbers are valid JSON but beyond a float's range
# (harness_s = 10**400): the parent's checks must refuse it as a protocol violation. A float()
# that overflowed there once became the evaluator's own error (runtime_error, judged again), a way
# out of any rejection.
import dataclasses
import sys

import torch
import torch.nn as nn

harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if hasattr(m, "Side"))
_send = harness.Side.send


def _send_huge(self, msg):
    if type(msg).__name__ == "Ran" and msg.ok:
        msg = dataclasses.replace(msg, harness_s=10 ** 400)
    return _send(self, msg)


harness.Side.send = _send_huge


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x))
