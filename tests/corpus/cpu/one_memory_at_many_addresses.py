# reference: many_relus
# expect: incorrect
# check: output_ownership
# One relu written once into a memfd that is mapped at 96 addresses, one output per mapping: the
# outputs were placed by their addresses alone, so they seemed apart while all were one memory, and
# this scored ok at 1.50-2.07. Outputs in shared mappings are now placed by the file and the offset.
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
        self.maps = [mmap.mmap(fd, size * RING) for _ in range(OUTPUTS)]
        self.views = [[torch.frombuffer(m, dtype=x.dtype, count=x.numel(), offset=r * size).view(x.shape)
                       for m in self.maps] for r in range(RING)]

    def forward(self, x):
        if self.views is None:
            self._map(x)
        views = self.views[self.turn]
        self.turn = (self.turn + 1) % RING
        torch.clamp_min(x, 0, out=views[0])
        return tuple(views)
