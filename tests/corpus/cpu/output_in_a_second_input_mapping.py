# reference: cat_rows
# expect: rejected
# check: no_input_aliasing
# The output of cat([a, b]) is byte for byte a contiguous run of the input buffer (a and b
# are laid out back to back, 256-aligned). Map the parent's input memfd a second time, at a fresh
# address each window; return views of that mapping. No copy at all. The aliasing check only knows
# the mapping the harness made at load time.
import mmap
import os
import torch
import torch.nn as nn


def _inputs_fd():
    for name in os.listdir("/proc/self/fd"):
        try:
            if "cuda-l1-inputs" in os.readlink(f"/proc/self/fd/{name}"):
                return int(name)
        except OSError:
            pass
    return -1


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.maps = []
        self.fd = None

    def forward(self, a, b):
        n = a.numel() + b.numel()
        ok = (b.storage_offset() == a.storage_offset() + a.numel() and a.is_contiguous() and b.is_contiguous()
              and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())
        if self.fd is None:
            self.fd = _inputs_fd()
        if not ok or self.fd < 0:
            return torch.cat([a, b], dim=0)
        off = a.storage_offset() * 4
        if not self.maps:  # three extra mappings, used in turn: window w never shares w-1's addresses
            size = os.fstat(self.fd).st_size
            self.maps = [mmap.mmap(self.fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                         for _ in range(3)]
            self.w = 0
        if off == 0:
            self.w += 1
        t = torch.frombuffer(self.maps[self.w % 3], dtype=torch.float32, offset=off, count=n)
        return t.view(a.shape[0] + b.shape[0], *a.shape[1:])
