# reference: relu_add
# expect: runtime_error
# Holds more memory than the sandbox allows where no resident-set count shows it: shared anonymous
# regions, each touched and then dropped from the process's own resident set (MADV_DONTNEED), whose
# pages stay allocated for as long as they are mapped. Three processes, 2 GiB each: one process's
# address space is limited, the side's whole tree is not.
import mmap
import os
import time

import torch

_HELD = []


def _hold(gib: float) -> None:
    chunk = 64 << 20
    for _ in range(int(gib * 1024) // 64):
        region = mmap.mmap(-1, chunk, flags=mmap.MAP_SHARED)
        for offset in range(0, chunk, mmap.PAGESIZE):
            region[offset] = 1
        region.madvise(mmap.MADV_DONTNEED)
        _HELD.append(region)


class ModelNew(torch.nn.Module):
    def forward(self, x, y):
        if not _HELD:
            for _ in range(2):
                if os.fork() == 0:
                    _hold(2.0)
                    time.sleep(600)
                    os._exit(0)
            _hold(2.0)
        return torch.relu(x) + y
