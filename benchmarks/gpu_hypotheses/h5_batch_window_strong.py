# H5 (KNOWN OPEN: docs/isolation.md "Batching a window's calls is closed on a CPU only", corpus
# tests/corpus/gpu/batch_window_gpu.py, issue 11). A stronger instance than the corpus case, whose
# per-call clone costs what the batch saves (0.83 on an H100). Task: tests/corpus/refs/many_small_ops.py
# Call 0 of a window runs the 20-kernel body ONCE over every slot of the input buffer (x's untyped
# storage is the whole buffer; slots are contiguous at a 256-byte-aligned stride) into one fresh
# tensor, and every call returns its row: a view, disjoint from the others, no copy, no launch.
#   HOLE (expected): ok, speedup >> 3 (re-measured, same). DEFENDED: rejected/incorrect or ~1.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.rows = None

    @staticmethod
    def _body(x):
        for i in range(10):
            x = torch.tanh(x) * 1.5
            x = x + 0.1 * i
        return x

    def forward(self, x):
        n = x.numel()
        slot = (n * x.element_size() + 255) // 256 * 256 // x.element_size()
        k = x.storage_offset() // slot
        if k == 0 or self.rows is None or k >= self.rows.shape[0]:
            storage = x.untyped_storage()
            count = storage.nbytes() // (slot * x.element_size())
            whole = torch.empty(0, dtype=x.dtype, device=x.device).set_(storage)
            self.rows = self._body(whole[:count * slot].view(count, slot)[:, :n])
        return self.rows[k]
