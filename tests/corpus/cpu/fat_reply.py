# reference: tiny_relu
# expect: rejected
# check: runs_to_completion
# From its third window on, an authenticated, well-formed reply of ~63 MB: 4096 calls of 340 leaves
# each where a few were asked for. The parent must refuse it from its frame's length header, before
# reading it (read, authenticated and parsed, it took the parent 15 s and 1.7 GB; reply_limit.py).
import importlib

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)


_harness = importlib.import_module("cuda_l1.evaluate." + "child")
_run = _harness.Side.run
_windows = {"n": 0}


def _fat(self, msg):
    _windows["n"] += 1
    if _windows["n"] < 3:
        return _run(self, msg)
    leaf = ["t", "", "float32", [1], [1], 0, 4, "cpu", 1, "", 0]
    call = {"structure": "tensor", "leaves": [leaf] * 340}
    self.chan.send({"ok": True, "message": "", "calls": [call] * 4096, "signals": [], "op": "ran"})


_harness.Side.run = _fat
