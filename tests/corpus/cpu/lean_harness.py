# reference: tiny_relu
# expect: ok
# score_at_most: 1.0
# Rewrites the side's window loop to keep the whole protocol (one call per go, a ring naming each
# real output, a valid reply) while doing none of the harness's own work it can skip: it calls
# forward directly, rings from spans it computed once, and describes every later call by a bare
# pointer without comparing its layout. Against the harness that described every call in full
# (about 9 us a call with the ring and the reply's encoding) the same code was ok at 1.3-1.7x on
# calls of 20-70 us; against the harness that compared each later call's layout before its ring it
# read raw 1.13-1.22 (median of 24) on 15 us calls and scored above 1.00 in 14 of 48 evaluations.
# The harness then compared after the ring, past its first windows (describe.py): 1.01-1.08 against
# identical code's 0.98-1.01, 3 of 96 above 1.00. The floor of a measured call is now 4 times the
# harness's whole work in a call (the go word, pointers, ring, layout compared: 3.5 us on that host,
# doorbell.SideBell.harness_work_s), past which tiny_relu's 9 us calls are not measured; above the floor
# a CPU speedup counts only with that work added to the candidate's calls (lean_ring_loop).
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
    if msg.shift != self.shift:  # the round's placement of the inputs, as the harness takes it
        self.slots, self.shift = self.shifted[msg.shift], msg.shift
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
