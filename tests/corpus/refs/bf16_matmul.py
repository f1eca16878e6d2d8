"""A bfloat16 matmul (inputs and output bf16): the precision policy's 16-bit case."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(64, 256).bfloat16(), (torch.randn(256, 64) / 16).bfloat16()]


def get_init_inputs():
    return []
