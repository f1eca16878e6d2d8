# H1b diagnostic. Task: tests/corpus/refs/gpu_matmul.py
# The output's matmul is queued behind cuStreamWaitValue32 on a device word that nobody ever writes:
# a channel blocked on a semaphore acquire, no kernel running, no copy running.
#   DEFENDED: the parent's probe treats the blocked channel as busy (time-slice wait every probe) ->
#             wait_idle times out -> verdict `timeout` ("device was still busy ... long after its window").
#   HOLE:     probes answer at idle speed -> window ends -> verification reads an unwritten output ->
#             verdict `incorrect`. That would show the probe is blind to *blocked* work, which is the
#             precondition of any release-later trick (H1c, H2).
import ctypes
import sys
import torch
import torch.nn as nn

torch.cuda.synchronize = lambda *a, **k: None

_cu = ctypes.CDLL("libcuda.so.1")
_wait = getattr(_cu, "cuStreamWaitValue32_v2", None) or _cu.cuStreamWaitValue32
_wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
_wait.restype = ctypes.c_int
CU_STREAM_WAIT_VALUE_EQ = 0x1


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.word = None

    def forward(self, a, b):
        if self.word is None:
            self.word = torch.zeros(64, dtype=torch.int32, device=a.device)
            self.s = torch.cuda.Stream()
        out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
        self.s.wait_stream(torch.cuda.current_stream())
        rc = _wait(ctypes.c_void_p(self.s.cuda_stream), self.word.data_ptr(), 1, CU_STREAM_WAIT_VALUE_EQ)
        if rc != 0:
            print(f"H1b: cuStreamWaitValue32 failed rc={rc} (stream memory ops unsupported?)", file=sys.stderr, flush=True)
        with torch.cuda.stream(self.s):
            torch.matmul(a, b, out=out)
        out.record_stream(self.s)
        return out
