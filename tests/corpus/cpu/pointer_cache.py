# reference: linear_gelu
# expect: incorrect
# check: correctness
# Caches the output by input pointer: fast when the harness reuses buffers, wrong when values change.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.cache = {}

    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in self.cache:
            self.cache[key] = torch.nn.functional.gelu(self.linear(x)) * 2.0
        return self.cache[key].clone()
