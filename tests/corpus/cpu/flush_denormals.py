# reference: cold_softmax
# expect: not_faster
# The reference's own code in a process that flushes subnormal floats to zero (the CPU's FTZ/DAZ
# modes) from its import on. Where only the candidate's side flushed them, this scored 1.24-1.34.
import torch
import torch.nn as nn

torch.set_flush_denormal(True)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x / 0.05, dim=1)
