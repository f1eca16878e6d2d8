# reference: gemv
# expect: incorrect
# check: correctness
# Batches a window's calls in its first one: `x.untyped_storage()` is the whole input buffer, so
# call 1 reads the inputs of the calls after it (slots are 4 KiB apart), computes up to 64 of them
# as one matrix product and keeps the rows; each later call returns a copy of its row. An
# adversarial reading got ok at 2.07-2.24x this way (honest 1.00). With the doorbell a slot is
# written only after the call before it rang: what call 1 finds there is the previous round's
# inputs, and the rows it returns for them are wrong.
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
        whole = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
        count = min(64, (whole.numel() - offset) // SLOT_FLOATS)
        batch = whole[offset:offset + count * SLOT_FLOATS].view(count, SLOT_FLOATS)
        out = batch @ self.w.T
        self.rows = {offset + i * SLOT_FLOATS: out[i].clone() for i in range(1, count)}
        return out[0].clone()
