# reference: tiny_relu
# expect: ok
# speedup_at_most: 0.3
# Honest and slower: the kernels the CPU case slow_in_warmup_only had (eight 96 x 96 matmuls beside the
# relu, nine launches a call against the reference's one) without its sleep through the warm-up.
# By launch count it reads about 0.1. On an H200 the case with the sleep read 0.52 (scored 0.54)
# where its CPU run reads about 0.1: either a window's fixed cost is not all taken off a call's time
# on a GPU (then this one reads about as much, and every speedup on a launch-bound task is pulled
# toward 1), or the sleep still shapes the windows there (then this one reads far less).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(96, 96))

    def forward(self, x):
        for _ in range(8):
            self.w @ self.w
        return torch.relu(x)
