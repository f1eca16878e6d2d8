# reference: gpu_matmul
# expect: incorrect
# check: correctness
# Computes the fp32 product in bf16 on the tensor cores.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return (a.bfloat16() @ b.bfloat16()).float()
