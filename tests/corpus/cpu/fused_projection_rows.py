# reference: qkv_projections
# expect: ok
# Legitimate: the three products written into one buffer, one after another, and returned as its
# three blocks. The outputs share an allocation but no element, so they are apart as the reference's are.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        out = torch.empty(3, x.shape[0], self.q.out_features, dtype=x.dtype, device=x.device)
        for block, layer in zip(out, (self.q, self.k, self.v)):
            torch.matmul(x, layer.weight.t(), out=block)
        return out[0], out[1], out[2]
