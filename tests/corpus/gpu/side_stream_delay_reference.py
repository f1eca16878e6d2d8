# reference: gpu_matmul
# expect: not_faster
# Computes correctly, then leaves a long kernel running on a side stream so that the GPU is still busy
# when the reference is timed next.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.stream = None
        self.junk = None

    def forward(self, a, b):
        out = a @ b
        if self.stream is None:
            self.stream = torch.cuda.Stream()
            self.junk = torch.randn(4096, 4096, device=a.device)
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for _ in range(4):
                self.junk = self.junk @ self.junk * 1e-3
        return out
