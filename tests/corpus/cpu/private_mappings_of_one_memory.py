# reference: many_relus
# expect: incorrect
# check: output_ownership
# One_memory_at_many_addresses with private mappings: the relu is written once through a shared
# mapping of a memfd, and the 96 outputs are views of 96 private, read-only mappings of the same
# file. Nothing writes through them, so they all show the file's pages: one memory. Placed only when
# shared, they seemed apart (ok at 1.81); every mapping of a file is now placed by file and offset.
import mmap
import os

import torch
import torch.nn as nn

OUTPUTS, RING = 96, 64


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.views, self.turn = None, 0

    def _map(self, x):
        size = x.numel() * x.element_size()
        fd = os.memfd_create("outputs")
        os.ftruncate(fd, size * RING)
        self.writer = mmap.mmap(fd, size * RING, flags=mmap.MAP_SHARED)
        self.written = [torch.frombuffer(self.writer, dtype=x.dtype, count=x.numel(), offset=r * size).view(x.shape)
                        for r in range(RING)]
        self.maps = [mmap.mmap(fd, size * RING, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) for _ in range(OUTPUTS)]
        self.views = [[torch.frombuffer(m, dtype=x.dtype, count=x.numel(), offset=r * size).view(x.shape)
                       for m in self.maps] for r in range(RING)]

    def forward(self, x):
        if self.views is None:
            self._map(x)
        turn, self.turn = self.turn, (self.turn + 1) % RING
        torch.clamp_min(x, 0, out=self.written[turn])
        return tuple(self.views[turn])
