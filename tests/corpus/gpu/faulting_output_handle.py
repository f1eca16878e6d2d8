# reference: gpu_matmul
# expect: rejected
# check: outputs_readable
# Names each output under an edited copy of its allocation's IPC handle: byte 31 of a legacy handle
# XOR 0x80 opened on driver 580 to a mapping of the right size whose first read faulted ("unspecified
# launch failure", benchmarks/gpu_hypotheses/handle_sweep.py). The fault is sticky: it ends the CUDA
# context of whichever process reads the output, here the reference's side. The candidate gains nothing
# by it but an evaluation that failed beside it (reference_ran, which a caller may retry); it is the
# candidate's own verdict instead, refused, and the reference's side is replaced. (Were the edit not to
# open, the verdict is the same: a handle that cannot be opened is refused.)
import torch
import torch.nn as nn

from cuda_l1.evaluate import cudadrv

_export = cudadrv.export_base


def export_base(base):  # the harness exports its outputs' allocations only
    raw = bytearray.fromhex(_export(base))
    raw[31] ^= 0x80
    return raw.hex()


cudadrv.export_base = export_base


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)
