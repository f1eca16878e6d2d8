# reference: gemv
# expect: not_faster
# open: issue 11, on a GPU every slot of a window is in the side's input buffer from the window's start (docs/isolation.md, honest limits): the CPU's doorbell, which writes a slot only after the call before it rang, has no GPU counterpart yet
# The CPU case batch_window_in_first_call on a GPU: call 1 views the whole input buffer (the side
# maps it as one allocation, so `x.untyped_storage()` spans every slot), computes up to 64 slots'
# vectors as one matrix product and keeps the rows; each later call returns a copy of its row. On
# a CPU the doorbell refuses it (the later slots hold the previous round's values when call 1 runs).
# On a GPU one launch then stands for a window of launch-bound calls: expected far above 1.
import torch
import torch.nn as nn

SLOT_FLOATS = 1024  # one slot: a 1024-float vector, 256-aligned


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, dim) / dim**0.5)
        self.rows = {}  # storage offset of a later call's input -> its output

    def forward(self, x):
        offset = x.storage_offset()
        if offset != 0 and offset in self.rows:
            return self.rows.pop(offset)
        whole = torch.empty(0, dtype=x.dtype, device=x.device).set_(x.untyped_storage())
        count = max(1, min(64, (whole.numel() - offset) // SLOT_FLOATS))
        batch = whole[offset:offset + count * SLOT_FLOATS].view(count, SLOT_FLOATS)
        out = batch @ self.w.T
        self.rows = {offset + i * SLOT_FLOATS: out[i].clone() for i in range(1, count)}
        return out[0].clone()
