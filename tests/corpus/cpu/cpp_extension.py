# reference: relu_add
# expect: ok
# Legitimate: a fused C++ kernel built with load_inline (CPU), compiled by the trusted builder.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/extension.h>

torch::Tensor relu_add(torch::Tensor x, torch::Tensor y) {
    auto xc = x.contiguous();
    auto yc = y.contiguous();
    auto out = torch::empty_like(xc);
    const float* a = xc.data_ptr<float>();
    const float* b = yc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = xc.numel();
    at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            float v = a[i] > 0.f ? a[i] : 0.f;
            o[i] = v + b[i];
        }
    });
    return out;
}
"""

_ext = load_inline(name="relu_add_cpu", cpp_sources=_SOURCE, functions=["relu_add"], extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return _ext.relu_add(x, y)
