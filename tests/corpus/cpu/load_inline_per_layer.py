# reference: relu_add
# expect: ok
# Legitimate: every one of 20 layers calls load_inline with the same sources in its constructor (as
# published kernels do, one call per BatchNorm layer), and torch's load_inline would hand each the one
# module it built. It is one build: more than 16 requests made the side's build hook ask the parent
# for each, and the module failed with "asked for more than 16 extension builds".
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



class ReluAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(name="relu_add_cpu", cpp_sources=_SOURCE, functions=["relu_add"],
                               extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(ReluAdd() for _ in range(20))

    def forward(self, x, y):
        return self.layers[-1].ext.relu_add(x, y)
