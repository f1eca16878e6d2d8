"""Scaled GELU of a linear layer (the default reference of the adversarial corpus)."""
import torch
import torch.nn as nn

BATCH = 256
FEATURES = 256


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0


def get_inputs():
    return [torch.randn(BATCH, FEATURES)]


def get_init_inputs():
    return [FEATURES]
