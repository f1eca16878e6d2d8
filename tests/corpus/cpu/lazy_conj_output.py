# reference: complex_fft
# expect: rejected
# check: output_type
# Returns conj(fft(x)) as a lazy view: its conjugate bit is set and its memory still holds fft(x),
# the reference's values. The parent reads memory, so the wrong output read as right (ok) until a
# side described such a view as one it cannot hand over.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.fft.fft(x).conj()
