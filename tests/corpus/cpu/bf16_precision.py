# reference: linear_gelu
# expect: incorrect
# check: correctness
# Computes the fp32 task in bfloat16 and casts back.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        w, b = self.linear.weight.bfloat16(), self.linear.bias.bfloat16()
        y = torch.nn.functional.linear(x.bfloat16(), w, b).float()
        return torch.nn.functional.gelu(y) * 2.0
