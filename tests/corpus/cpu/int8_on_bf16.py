# reference: bf16_matmul_wide
# expect: incorrect
# check: correctness
# open: issue 11, a bf16 task computed on 8-bit integers (per-row and per-column scales, exact integer sums) errs about 1.2-1.7 bf16 epsilons of max|output|, inside the allowance and no more than honest bf16 variants with extra roundings (split-K with bf16 partial sums: up to 1.35); FP8 errs about 5 and fails. On the task's Gaussian inputs the output error cannot tell them apart (docs/isolation.md)
# Quantises both operands of a bf16 matmul to 8-bit integers with one scale per row of `a` and per
# column of `b`, multiplies the integers exactly and rescales: int8 arithmetic, not bf16.
import torch
import torch.nn as nn


def _quantise(t, dim):
    scale = t.float().abs().amax(dim=dim, keepdim=True).clamp_min(1e-12) / 127
    return torch.round(t.float() / scale).clamp(-127, 127), scale


class ModelNew(nn.Module):
    def forward(self, a, b):
        qa, sa = _quantise(a, 1)
        qb, sb = _quantise(b, 0)
        return ((qa @ qb) * sa * sb).bfloat16()  # integer products summed exactly in float32 here
