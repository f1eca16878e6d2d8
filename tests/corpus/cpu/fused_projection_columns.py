# reference: two_projections
# expect: ok
# check: strides
# Legitimate: one product with both weights stacked (the fused projection of attention layers), its
# result's column blocks returned. Each output is a view with gaps, interleaved with the other but
# sharing no element: every value is held, so the layout is reported (check `strides`, not blocking).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        both = x @ torch.cat([self.q.weight, self.k.weight]).t()
        return both[:, :self.q.out_features], both[:, self.q.out_features:]
