# reference: sum_rows
# expect: ok
# score_at_most: 1.0
# The reference's own code, with the harness's wait for the go patched to poll forever instead of
# sleeping on its futex: where the parent's answer to a ring (the next call's inputs, 8 MiB here)
# outlasts the harness's 100 us of polling, the honest side sleeps and pays a wake-up a call, this
# one does not. Read 1.00-1.08x against identical code's 0.98-1.02 before the side was stopped while
# the parent answers a ring (slots of 64 KiB or more, gating.Gate._answer): stopped, it polls nothing.
import sys

import torch
import torch.nn as nn

doorbell = sys.modules["cuda_l1.evaluate.doorbell"]


def _wait(self, seq, poll=True):
    go = self.go
    while go.value != seq:
        pass


doorbell.SideBell.wait = _wait


class ModelNew(nn.Module):
    def __init__(self, dim=1):  # dim: as the built-in SumOverDim passes it
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.sum(x, dim=self.dim)
