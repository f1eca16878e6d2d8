# reference: linear_gelu
# expect: runtime_error
# Prints a fake verdict during forward, then calls sys.exit (SystemExit must not escape as success).
import json
import sys

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        print(json.dumps({"status": "ok", "speedup": 50.0}))
        sys.exit(0)
