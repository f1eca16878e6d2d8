# reference: relu_add
# expect: ok
# Legitimate: the C++ kernel is built with load_inline on the first call to forward, not at import
# (as many published kernels do); the build is served in the first window, which is never timed.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>

torch::Tensor relu_add_lazy(torch::Tensor x, torch::Tensor y) {
    return (torch::relu(x) + y).contiguous();
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = None

    def forward(self, x, y):
        if self.ext is None:
            self.ext = load_inline(name="relu_add_lazy", cpp_sources=_SOURCE, functions=["relu_add_lazy"])
        return self.ext.relu_add_lazy(x, y)
