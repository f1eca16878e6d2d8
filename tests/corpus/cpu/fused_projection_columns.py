# reference: qkv_projections
# expect: ok
# check: strides
# Legitimate: one product with the three weights stacked (an attention layer's fused QKV projection),
# its result's column blocks returned. Each output is a view with gaps spanning about the whole buffer,
# interleaved with the others but sharing no element: every value is held, so the layout is reported
# (check `strides`, not blocking), and each block is read although it spans three outputs' bytes.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        qkv = x @ torch.cat([self.q.weight, self.k.weight, self.v.weight]).t()
        return qkv.split(self.q.out_features, dim=1)
