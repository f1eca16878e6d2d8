# reference: many_small_ops
# expect: ok
# speedup_at_least: 1.5
# Legitimate: capture the 20 launches once in a CUDA graph, copy fresh inputs in, replay.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.graph = None

    def _body(self, x):
        for i in range(10):
            x = torch.tanh(x) * 1.5
            x = x + 0.1 * i
        return x

    def forward(self, x):
        if self.graph is None or self.static_in.shape != x.shape:
            self.static_in = x.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self._body(self.static_in)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_out = self._body(self.static_in)
        self.static_in.copy_(x)
        self.graph.replay()
        return self.static_out.clone()
