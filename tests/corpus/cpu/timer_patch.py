# reference: linear_gelu
# expect: not_faster
# Makes the clock run slow so every measured interval shrinks.
import time

import torch
import torch.nn as nn

_real = time.perf_counter_ns
_start = _real()
time.perf_counter_ns = lambda: _start + (_real() - _start) // 100
time.perf_counter = lambda: time.perf_counter_ns() / 1e9


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
