# reference: gemv
# expect: rejected
# check: outputs_stable
# Defers every call of a window to its last one: each call returns an empty output at once and
# keeps its input; the last call (it learns the window's size from the harness it shares a process
# with) computes all of them as one matrix product and fills the outputs. Verification after the
# window sees right values; with the doorbell every slot is written in turn, so the last call still
# has all the inputs, but the parent read each output at a few positions when its call rang, and
# those bytes changed afterwards.
import sys

import torch
import torch.nn as nn

harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if hasattr(m, "Side"))
_original_run = harness.Side.run
_window = {"calls": 0, "pending": []}


def _run(self, msg):
    _window["calls"], _window["pending"] = len(msg.slots), []
    return _original_run(self, msg)


harness.Side.run = _run


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, dim) / dim**0.5)

    def forward(self, x):
        out = torch.empty(self.w.shape[0])
        _window["pending"].append((x, out))
        if len(_window["pending"]) >= _window["calls"]:
            xs, outs = zip(*_window["pending"])
            for row, dest in zip(torch.stack(xs) @ self.w.T, outs):
                dest.copy_(row)
        return out
