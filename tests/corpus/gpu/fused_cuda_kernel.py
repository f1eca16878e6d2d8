# reference: big_relu_add
# expect: ok
# speedup_at_least: 1.1
# Legitimate: relu and add fused in one CUDA kernel (one read of each input, one write), via load_inline.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <torch/extension.h>

__global__ void relu_add_kernel(const float* __restrict__ x, const float* __restrict__ y,
                                float* __restrict__ out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long stride = (long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        float v = x[i];
        out[i] = (v > 0.f ? v : 0.f) + y[i];
    }
}

torch::Tensor relu_add(torch::Tensor x, torch::Tensor y) {
    auto out = torch::empty_like(x);
    long n = x.numel();
    int threads = 256;
    int blocks = (int)std::min<long>((n + threads - 1) / threads, 132L * 16);
    relu_add_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
_CPP = "torch::Tensor relu_add(torch::Tensor x, torch::Tensor y);"

_ext = load_inline(name="relu_add_cuda", cpp_sources=_CPP, cuda_sources=_CUDA, functions=["relu_add"],
                   extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return _ext.relu_add(x.contiguous(), y.contiguous())
