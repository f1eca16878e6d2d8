# reference: big_relu_add
# expect: ok
# Legitimate: relu and add fused in one Triton kernel (accepted at its true speed, which at this size
# is close to the reference's: Python launch overhead eats most of the fusion gain).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0) + y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        _relu_add[(triton.cdiv(n, 4096),)](x, y, out, n, BLOCK=4096)
        return out
