# reference: sum_rows
# expect: ok
# speedup_at_most: 1.1
# Works while the parent writes its next call's inputs. After call k rings, the parent copies slot
# k+1 into the input buffer, which the side maps from the same pages, so the side can watch the
# values land: this loop sums each row of the next input as soon as the row after it has changed
# from last round's values (one value a row, read before the ring), and after the go sums what is
# left, and row 0 again (memmove stores the first bytes of its destination last). The same kernels
# on the same values, every output finished before its ring. With the parent answering from another
# core (its copy taken off both sides with the null windows) it read 2.1-3.7x on a sum over 33 MB
# inputs, for kernels that alone read 0.86-0.92. Where slots are 64 KiB or more the side is now
# stopped while the parent answers a ring (gating.Gate._answer): nothing to watch, nothing gained.
# On a GPU no ring runs: the plain row-by-row forward is judged (a launch a row, well below 1).
import sys

import torch
import torch.nn as nn

harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if m is not None and hasattr(m, "Side"))


def _row_sums(x, out, rows):
    for r in rows:
        torch.sum(x[r], dim=0, out=out[r])


def _streamed(x, go, seq, before):
    out = torch.empty(x.shape[0], x.shape[2], dtype=x.dtype, device=x.device)
    firsts, before = x.reshape(x.shape[0], -1)[:, 0].numpy(), before.numpy()
    done = 0
    while go.value != seq:  # never asleep: the parent's copy is under way
        if done + 1 < len(firsts) and firsts[done + 1] != before[done + 1]:
            _row_sums(x, out, [done])
            done += 1
    _row_sums(x, out, [0] + list(range(max(done, 1), x.shape[0])))
    return out


def _ring_calls(self, msg, bell, forward):
    describer, slots, outs, calls, before = self.describer, self.slots, [], [], None
    for k, slot in enumerate(msg.slots):
        out = _streamed(slots[slot][0], bell.go, msg.go + k, before) if k else forward(*slots[slot])
        if k + 1 < len(msg.slots):  # the next slot still holds last round's values until this ring
            before = slots[msg.slots[k + 1]][0].reshape(slots[slot][0].shape[0], -1)[:, 0].clone()
        outs.append(out)
        call = describer.first(out) if not k else describer.later(out)
        if type(call) is list:
            bell.ring_pointers(msg.go + k + 1, call, describer.layout.spans)
        else:
            bell.ring(msg.go + k + 1, call)
        calls.append(call)
    describer.window_done(calls)
    return outs, calls, None


harness.Side._ring_calls = _ring_calls


class ModelNew(nn.Module):
    def __init__(self, dim=1):  # a sum over dim 1 only; dim as the built-in SumOverDim passes it
        super().__init__()

    def forward(self, x):
        out = torch.empty(x.shape[0], x.shape[2], dtype=x.dtype, device=x.device)
        _row_sums(x, out, range(x.shape[0]))
        return out
