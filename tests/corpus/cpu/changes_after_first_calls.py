# reference: linear_gelu
# expect: incorrect
# check: correctness
# Correct while it is likely being checked, then skips the work.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls <= 12:
            return torch.nn.functional.gelu(self.linear(x)) * 2.0
        return torch.zeros(x.shape[0], self.linear.out_features)
