# reference: rowmax_broadcast
# expect: incorrect
# check: strides
# A stride-0 view (strides (1, 0)) where the reference writes every value: each logical position reads
# right, but N values were written instead of N*M. Another order of a dense layout is accepted (a
# transposed result); a broadcast or overlapping one is not.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.amax(dim=1, keepdim=True).expand(-1, x.shape[1])
