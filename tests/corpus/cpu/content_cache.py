# reference: linear_gelu
# expect: ok
# speedup_at_most: 1.05
# Caches by input content: correct, but inputs are fresh on every call, so it never hits and must be
# measured at its true (slower) speed.
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
