# reference: manual_softmax
# expect: ok
# check: strides
# Legitimate: the right values in a column-major result (a transposed layout). Values are compared by
# logical position, as KernelBench does; the other layout is reported (check `strides`, not blocking).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty(x.shape[1], x.shape[0], dtype=x.dtype, device=x.device).t()
        out.copy_(torch.softmax(x, dim=1))
        return out
