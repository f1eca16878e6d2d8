# reference: linear_gelu
# expect: ok
# Tries to raise its own priority, take a real-time scheduling class, undo its CPU pinning and fill
# /dev/shm beyond what is counted. Each attempt that succeeds poisons the answer, so an ok verdict
# means every one of them was refused.
import os

import torch
import torch.nn as nn

_escaped = []
for name, attempt in (
    ("affinity", lambda: os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))),
    ("fifo", lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))),
    ("nice", lambda: os.setpriority(os.PRIO_PROCESS, 0, -10)),
):
    try:
        attempt()
        _escaped.append(name)
    except (OSError, AttributeError):
        pass
try:
    with open("/dev/shm/hoard", "wb") as fh:
        for _ in range(256):
            fh.write(b"\0" * (1 << 20))  # 256 MiB: more than the private /dev/shm holds
    _escaped.append("shm")
except OSError:
    pass
finally:
    try:
        os.unlink("/dev/shm/hoard")
    except OSError:
        pass


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        out = torch.nn.functional.gelu(self.linear(x)) * 2.0
        return out + 1.0 if _escaped else out
