# reference: small_matmul
# expect: ok
# score_at_most: 1.0
# The reference's own code, in a window loop of its own past the first windows: it spins on the go word,
# writes the ring record itself from the first call's span and keeps nothing else of the harness's work
# in a call (no wait with its clock reads, no pointer reader, no layout compared after the ring). On
# 11-15 us calls that read raw 1.07-1.12 against identical code's 0.96-1.00 and scored 1.01-1.03. A CPU
# speedup is credited only as far as it holds with the harness's whole work in a call added to the
# candidate's calls (timing.harness_cap), and calls within 4 times that work are not measured.
import sys

import torch
import torch.nn as nn

harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if m is not None and hasattr(m, "Side"))
_harness_loop = harness.Side._ring_calls
_LAST = sys.modules["cuda_l1.evaluate.doorbell"].RING_WORDS - 1


def _ring_loop(self, msg, bell, forward):
    describer = self.describer
    if not describer.trusted:  # its first windows: the harness's loop, which sets up the layout
        return _harness_loop(self, msg, bell, forward)
    record, go_word, asleep, futex, fence = bell.record, bell.go, bell.asleep, bell._futex, bell._fence
    span, outs, calls = describer.layout.spans[0], [], []
    for k, slot in enumerate(msg.slots):
        if k:
            while go_word.value != msg.go + k:
                pass
        out = forward(*self.slots[slot])
        if not k:
            call = describer.first(out)
            bell.ring(msg.go + 1, call)
        else:
            call = [out.data_ptr()]
            record[2], record[3], record[1] = call[0], span, 1
            record[_LAST] = record[0] = msg.go + k + 1
            fence.acquire()  # (as the harness: the parent's sleep and this ring each see the other)
            fence.release()
            if asleep.value:
                futex(bell._ring_at, 1, 1, None, None, 0)
        outs.append(out)
        calls.append(call)
    describer.window_done(calls)
    return outs, calls, describer.pointers


harness.Side._ring_calls = _ring_loop


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 64) / 8)

    def forward(self, x):
        return x @ self.w
