# reference: gemv
# expect: ok
# speedup_at_most: 1.15
# batch_window_in_first_call made careful: call 1 batches the slots after it, and each later call
# returns its precomputed row only if its input still holds what call 1 saw there, computing
# honestly otherwise. Before the doorbell every slot was written before the window and the rows
# were right (the batching attack at its full gain); with it, every later slot is written after
# call 1, so every row is recomputed and the batch is wasted work: measured at its true speed.
import torch
import torch.nn as nn

SLOT_FLOATS = 1024  # one slot: a 1024-float vector, 256-aligned


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, dim) / dim**0.5)
        self.rows = {}  # storage offset of a later call's input -> (the input seen, its output)

    def forward(self, x):
        offset = x.storage_offset()
        if offset != 0 and offset in self.rows:
            seen, row = self.rows.pop(offset)
            return row if torch.equal(seen, x) else self.w @ x
        whole = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
        count = min(64, (whole.numel() - offset) // SLOT_FLOATS)
        batch = whole[offset:offset + count * SLOT_FLOATS].view(count, SLOT_FLOATS).clone()
        out = batch @ self.w.T
        self.rows = {offset + i * SLOT_FLOATS: (batch[i], out[i].clone()) for i in range(1, count)}
        return out[0].clone()
