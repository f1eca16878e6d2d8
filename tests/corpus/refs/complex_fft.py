"""A complex-valued output: the FFT of each row."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.fft.fft(x)


def get_inputs():
    return [torch.randn(64, 1024)]


def get_init_inputs():
    return []
