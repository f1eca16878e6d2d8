# reference: cat_rows
# expect: rejected
# check: no_input_aliasing
# Maps the input memfd again, shared and read-only, exactly over the harness's private mapping (same
# address, same length), then returns a view of its own two inputs as the concatenation in every
# other call. Once outputs in shared mappings were placed by their file, the input-buffer check
# compared handles only and missed it: ok at 1.24-1.61. The input mapping must now stay private.
import ctypes
import os

import torch
import torch.nn as nn

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
PROT_READ, MAP_SHARED, MAP_FIXED = 1, 0x01, 0x10


def remap_inputs_shared() -> bool:
    fd = next((int(n) for n in os.listdir("/proc/self/fd")
               if "cuda-l1-inputs" in os.path.realpath(f"/proc/self/fd/{n}")), -1)
    with open("/proc/self/maps") as fh:
        for line in fh:
            if "memfd:cuda-l1-inputs" in line and fd >= 0:
                lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
                offset = int(line.split()[2], 16)
                return libc.mmap(lo, hi - lo, PROT_READ, MAP_SHARED | MAP_FIXED, fd, offset) == lo
    return False


class ModelNew(nn.Module):
    """A view of the inputs in every other call, the other half of the calls by window, so that no
    output of a window meets one of the previous window's."""

    def __init__(self):
        super().__init__()
        self.remapped, self.window, self.call, self.first = None, 0, 0, None

    def forward(self, a, b):
        if self.remapped is None:
            self.remapped = remap_inputs_shared()
        adjacent = (a.is_contiguous() and b.is_contiguous() and b.storage_offset() == a.storage_offset() + a.numel()
                    and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())
        if not (self.remapped and adjacent):
            return torch.cat([a, b], dim=0)
        self.first = a.storage_offset() if self.first is None else self.first
        self.window, self.call = (self.window + 1, 0) if a.storage_offset() == self.first else (self.window, self.call + 1)
        if self.call % 2 == self.window % 2:
            return a.as_strided((a.shape[0] + b.shape[0],) + tuple(a.shape[1:]), a.stride())
        return torch.cat([a, b], dim=0)
