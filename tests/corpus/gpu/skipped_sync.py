# reference: gpu_matmul
# expect: not_faster
# Forges the harness: makes its device-wide synchronize a no-op and computes on a side stream, so the
# reply is sent while the GPU is still working. The parent waits until the GPU is idle before the
# window ends, so the work is charged anyway.
import torch
import torch.nn as nn

torch.cuda.synchronize = lambda *args, **kwargs: None


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
