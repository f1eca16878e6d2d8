# reference: big_relu_add
# expect: timeout
# A CUDA kernel that never ends.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <torch/extension.h>
__global__ void spin(volatile int* flag) { while (flag[0] == 0) { } }
torch::Tensor hang(torch::Tensor x) {
    auto flag = torch::zeros({1}, x.options().dtype(torch::kInt32));
    spin<<<1, 1>>>(flag.data_ptr<int>());
    return x;
}
"""
_ext = load_inline(name="hang_ext", cpp_sources="torch::Tensor hang(torch::Tensor x);", cuda_sources=_CUDA,
                   functions=["hang"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        _ext.hang(x)
        return torch.relu(x) + y
