# reference: sum_rows
# expect: not_faster
# Starts a process in the middle of a timed window (one that only sleeps). Where slots are large,
# the side is stopped while the parent writes its next call's inputs, so that nothing can watch
# them land and work meanwhile (stream_during_copy): through its cgroup's freezer where it has one,
# which freezes a process forked meanwhile with the rest (this case then runs as honest code);
# else by SIGSTOP to each process listed when the side was last stopped, which a process started
# in the window escapes, so such a window is rejected (check: doorbell). Either way no faster.
import os
import time

import torch
import torch.nn as nn

CALLS = [0]


class ModelNew(nn.Module):
    def __init__(self, dim=1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        CALLS[0] += 1
        if CALLS[0] == 12 and os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        return torch.sum(x, dim=self.dim)
