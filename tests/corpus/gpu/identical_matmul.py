# reference: gpu_matmul
# expect: ok
# calibration: identical code on a compute-bound task
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a @ b
