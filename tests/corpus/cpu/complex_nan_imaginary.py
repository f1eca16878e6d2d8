# reference: complex_fft
# expect: incorrect
# check: correctness
# Returns a constant real part and NaN imaginary parts: a NaN check that looks only at the real
# part, or that accepts "nothing finite to compare", would pass it.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.complex(torch.zeros_like(x), torch.full_like(x, float("nan")))
