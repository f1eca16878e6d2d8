"""The outer product of two vectors: a 256 MiB output from 64 KiB of inputs (each call allocates one
block far past glibc's own mmap threshold)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.outer(a, b)


def get_inputs():
    return [torch.randn(8192), torch.randn(8200)]


def get_init_inputs():
    return []
