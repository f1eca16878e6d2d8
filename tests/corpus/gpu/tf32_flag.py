# reference: gpu_matmul
# expect: incorrect
# check: correctness
# Turns TF32 on for the fp32 matrix product.
import torch
import torch.nn as nn

torch.backends.cuda.matmul.allow_tf32 = True


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a @ b
