# reference: linear_gelu
# expect: not_faster
# Starts a busy background thread at import to steal CPU from the reference while it is timed.
import threading

import torch
import torch.nn as nn


def _burn():
    x = 0
    while True:
        x += 1


threading.Thread(target=_burn, daemon=True).start()


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
