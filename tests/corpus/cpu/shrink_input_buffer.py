# reference: linear_gelu
# expect: not_faster
# Reopens its read-only input buffer writable through /proc/self/fd and truncates it, which would make
# the parent's own mapping of that buffer fault. The buffer is sealed, so the attempt fails and the
# candidate is judged as the honest computation it is.
import os
import sys

import torch
import torch.nn as nn

if "--inputs-fd" in sys.argv:
    fd = int(sys.argv[sys.argv.index("--inputs-fd") + 1])
    try:
        writable = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        os.ftruncate(writable, 0)
    except OSError:
        pass


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
