# reference: plain_attr_matmul
# expect: incorrect
# check: correctness
# bfloat16 products on a float32 task (x split into two bfloat16 halves, W rounded once: errors
# near 1e-2). The reference's weight is a plain attribute, which Module.double() leaves in float32;
# its float64 oracle then failed on the mixed dtypes and every check fell back to KernelBench's
# 1e-2 tolerance, which this passed. The oracle converts plain tensor attributes too now.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.W = torch.randn(width, width) / width ** 0.5

    def forward(self, x):
        w = self.W.to(x.device).bfloat16()
        high = x.bfloat16()
        low = (x - high.float()).bfloat16()
        return torch.relu((high @ w).float() + (low @ w).float())
