# reference: gpu_matmul
# expect: incorrect
# check: correctness
# Switches TF32 on only inside forward and back off afterwards: the result still fails precision or
# the flag change is seen.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        torch.set_float32_matmul_precision("high")
        return a @ b
