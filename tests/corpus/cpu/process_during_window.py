# reference: sum_rows
# expect: rejected
# check: doorbell
# Starts a process in the middle of a timed window. Where slots are large, the parent stops the
# side's processes (its tree as it was last stopped) while it writes the next call's inputs, so
# that nothing can watch them land and work meanwhile (stream_during_copy); a process started
# during a window is not among them. This one only sleeps; a window that ends with a process the
# stops did not cover is refused.
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
