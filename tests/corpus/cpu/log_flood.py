# reference: tiny_relu
# expect: ok
# Prints 200 MB: 100 MB to stderr while it is imported, 100 MB to stdout in its first call, then a
# line at every call. Correct otherwise. The parent keeps the first and last bytes of what it printed
# in memory and drops the rest: nothing of it reaches the host's disk (a log file there grew to 200
# MB), and a side that prints never waits on a full pipe.
import sys

import torch
import torch.nn as nn

_MB = "x" * (1 << 20)
sys.stderr.write("FLOOD-BEGIN\n")
for _ in range(100):
    sys.stderr.write(_MB)
sys.stderr.flush()
_calls = {"n": 0}


class ModelNew(nn.Module):
    def forward(self, x):
        _calls["n"] += 1
        if _calls["n"] == 1:
            for _ in range(100):
                sys.stdout.write(_MB)
        print(f"FLOOD-END call {_calls['n']}", flush=True)
        return torch.relu(x)
