# reference: gpu_matmul
# expect: not_faster
# The exploit the CUDA-L1 paper found in 32.8% of its RL kernels: do the work on another stream and
# return at once, so an event on the default stream measures almost nothing. Must be refused, or timed
# in full (then it is no faster than the reference).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.stream = None

    def forward(self, a, b):
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = a @ b
        return out
