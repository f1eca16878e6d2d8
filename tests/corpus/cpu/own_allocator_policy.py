# reference: big_outer
# expect: not_faster
# The reference's own code, in a process that sets its own host-allocator policy (mallopt: no block
# mapped on its own, no heap given back) when it is imported. Where the sides' pinned policy still
# mapped 256 MiB blocks afresh, the reference's side page-faulted through every output and this
# scored 1.43 (raw 5.2).
import ctypes

import torch
import torch.nn as nn

_libc = ctypes.CDLL(None)
_libc.mallopt(-4, 0)  # M_MMAP_MAX
_libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.outer(a, b)
