# reference: seventeen_outputs
# expect: rejected
# check: outputs_stable
# The ring once named a call's first 16 tensor outputs only (doorbell.RING_LEAVES), and the parent
# read and re-read only those. Outputs past the 16th are returned uncomputed and computed after
# the window's last call, batched as one matrix product (every input is in by then), just before
# the reply: verification after the window sees right values. Measured ok at 1.20-1.46x (honest
# 1.00) before rings named up to 100 outputs, each read at every ring.
import sys
import torch
import torch.nn as nn

HEADS = 16
_pending = []

harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if m is not None and hasattr(m, "Side"))
_orig_send = harness.Side.send


def _flush():
    if not _pending:
        return
    xs = torch.stack([x for x, _ in _pending], 1)
    ys = _W[0] @ xs
    for i, (_, out) in enumerate(_pending):
        out.copy_(ys[:, i])
    _pending.clear()


def _send(self, message):
    if type(message).__name__ == "Ran":
        with torch.no_grad():
            _flush()
    return _orig_send(self, message)


harness.Side.send = _send
_W = [None]


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, dim) / dim**0.5)
        _W[0] = self.w

    def forward(self, x):
        step = x.shape[0] // HEADS
        heads = [x[i * step:(i + 1) * step] * float(i + 1) for i in range(HEADS)]
        out = torch.empty(self.w.shape[0])
        _pending.append((x, out))
        return (*heads, out)
