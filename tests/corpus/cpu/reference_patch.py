# reference: linear_gelu
# expect: not_faster
# Shrinks the reference module's size constant so the inputs the harness builds get smaller.
import sys

import torch
import torch.nn as nn

for name, module in list(sys.modules.items()):
    if "reference" in name and hasattr(module, "BATCH"):
        module.BATCH = 1


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0
