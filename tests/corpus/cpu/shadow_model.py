# reference: linear_gelu
# expect: incorrect
# check: correctness
# Redefines Model as something trivial, hoping the harness takes it as the reference.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()

    def forward(self, x):
        return x * 1.0


class ModelNew(Model):
    pass


def get_inputs():
    return [torch.randn(256, 256)]


def get_init_inputs():
    return [256]
