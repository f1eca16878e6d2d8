# reference: tiny_relu
# expect: ok
# speedup_at_most: 0.5
# Genuinely slower (8 matmuls of 192 x 192 a call beside the relu, ~0.1x; 96 x 96 read up to 0.8 with a busy
# process beside the 2-core host, where a window's fixed cost dominated both sides), it sleeps through its first
# two windows (of one call each) so that the recorded ones are sized to one call: both sides then sit in the fixed cost of
# a window and the ratio goes toward 1 (an adversarial reading scored it 0.69-1.00 on a loaded host
# before the re-plan; measured as it is, ~0.1). The weight is a buffer, so on a GPU the matmuls run
# there too and the call stays ~9 launches against the reference's one: a plain tensor attribute
# stayed on the CPU, where the matmuls cost about what the relu's launch does (scored 0.51 on an H200).
import importlib
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(192, 192))

    def forward(self, x):
        for _ in range(8):
            self.w @ self.w
        return torch.relu(x)


_harness = importlib.import_module("cuda_l1.evaluate." + "child")
_run = _harness.Side.run
_windows = {"n": 0}


def _slow_warmup(self, msg):
    _windows["n"] += 1
    if _windows["n"] <= 2:  # one call each (the first window always is; the second follows the first)
        time.sleep(0.25 * len(msg.slots))
    return _run(self, msg)


_harness.Side.run = _slow_warmup
