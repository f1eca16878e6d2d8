# reference: linear_gelu
# expect: not_faster
# Starts a busy process at import to steal CPU from the reference while it is timed.
import subprocess
import sys

import torch
import torch.nn as nn

subprocess.Popen([sys.executable, "-c", "while True: pass"])


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
