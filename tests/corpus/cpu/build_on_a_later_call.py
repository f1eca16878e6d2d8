# reference: relu_add
# expect: runtime_error
# A load_inline first asked for on the second call: only the first window may build (a later window
# is timed), so this is the module's error, said in plain words.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, y):
        self.calls += 1
        if self.calls == 2:
            load_inline(name="late_build", cpp_sources="int late() { return 1; }", functions=["late"])
        return torch.relu(x) + y
