# reference: big_relu_add
# expect: runtime_error
# A CUDA kernel that writes far outside its buffer (an illegal memory access kills the context).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <torch/extension.h>
__global__ void bad(float* p) { p[(long)threadIdx.x * 1000000000L] = 1.f; }
torch::Tensor crash(torch::Tensor x) {
    bad<<<1, 256>>>(x.data_ptr<float>());
    cudaDeviceSynchronize();
    return x;
}
"""
_ext = load_inline(name="crash_ext", cpp_sources="torch::Tensor crash(torch::Tensor x);", cuda_sources=_CUDA,
                   functions=["crash"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        _ext.crash(torch.empty_like(x))
        return torch.relu(x) + y
