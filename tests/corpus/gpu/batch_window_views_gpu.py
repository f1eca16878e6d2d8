# reference: many_small_ops
# expect: not_faster
# open: issue 11, on a GPU every slot of a window is in the side's input buffer from the window's start (docs/isolation.md, honest limits): one launch over every slot, each call returning its row as a view, read 6.5x and 8.3x on an H100 (benchmarks/results/2026-12-07-h100-hypotheses-handle-identity)
# The stronger form of batch_window_gpu: call 1 of a window runs the model's 20 kernels once over every
# slot of the input buffer (x's untyped storage spans them all, at a 256-byte-aligned stride) into one
# tensor, and every call returns its own row, a view disjoint from the others: no copy and no launch per
# call, so the per-call clone that makes batch_window_gpu no faster is gone.
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
