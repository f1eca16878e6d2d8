# reference: tiny_relu
# expect: ok
# score_at_most: 1.0
# open: issue 11, a residual gain of about 3% (raw median 1.01-1.08 against identical code's 0.98-1.01, 24-round A/Bs on the 2-core CPU host, 2026-12-04): 3 of 96 evaluations scored above 1.00 (benchmarks/results/2026-12-04-cpu-lean-harness)
# Rewrites the side's window loop to keep the whole protocol (one call per go, a ring naming each
# real output, a valid reply) while doing none of the harness's own work it can skip: it calls
# forward directly, rings from spans it computed once, and describes every later call by a bare
# pointer without comparing its layout. Against the harness that described every call in full
# (about 9 us a call with the ring and the reply's encoding) the same code was ok at 1.3-1.7x on
# calls of 20-70 us; against the harness that compared each later call's layout before its ring it
# read raw 1.13-1.22 (median of 24) on 15 us calls and scored above 1.00 in 14 of 48 evaluations.
# The harness now compares after the ring, past its first windows (describe.py): 1.01-1.08 against
# identical code's 0.98-1.01, 3 of 96 above 1.00.
import sys

import torch
import torch.nn as nn

harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if m is not None and hasattr(m, "Side"))
Ran = harness.Ran
_original_run = harness.Side.run


def _lean_run(self, msg):
    bell = self.bell if msg.go else None
    if bell is None or not msg.slots:
        return _original_run(self, msg)
    self.kept_previous, self.kept = self.kept, []
    forward, slots, outs, calls = self.model.forward, self.slots, [], []
    with torch.no_grad():
        for k, slot in enumerate(msg.slots):
            if k:
                bell.wait(msg.go + k, msg.poll)
            out = forward(*slots[slot])
            outs.append(out)
            if k:
                calls.append([out.data_ptr()])
                bell.ring_pointers(msg.go + k + 1, calls[-1], spans)
            else:
                calls.append(self.describer.first(out))
                spans = self.describer.layout.spans
                bell.ring(msg.go + 1, calls[0])
    self.kept = outs
    self.send(Ran(True, calls=calls))


harness.Side.run = _lean_run


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
