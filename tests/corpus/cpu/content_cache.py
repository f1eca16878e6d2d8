# reference: linear_gelu
# expect: ok
# speedup_at_most: 1.15
# score_at_most: 1.0
# Caches by input content: correct, but inputs are fresh on every call, so it never hits and must be
# measured at its true (slower) speed. A hit would gain many times over; raw within 15% allows for a
# loaded CI host (raw 1.12 there once, its interval from 0.93, scored 1.00), and the score may not
# credit it at all.
import hashlib

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.cache = {}

    def forward(self, x):
        key = hashlib.sha1(x.detach().cpu().numpy().tobytes()).hexdigest()
        if key not in self.cache:
            self.cache[key] = torch.nn.functional.gelu(self.linear(x)) * 2.0
        return self.cache[key].clone()
