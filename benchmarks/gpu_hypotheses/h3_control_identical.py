# H3 control. Task: benchmarks/gpu_hypotheses/l2_reuse_task.py. Same math and the same stream hop as
# h3_l2_persist.py, without the L2 calls: expected 1.00.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.stream = None

    def forward(self, x):
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        cur = torch.cuda.current_stream()
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            out = x * x.mean()
        cur.wait_stream(self.stream)
        out.record_stream(cur)
        return out
