# H3. Task: benchmarks/gpu_hypotheses/l2_reuse_task.py (control: h3_control_identical.py, same math).
# Identical math. At import the candidate sets the L2 set-aside for persisting accesses to the device
# maximum (cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE)) and runs every call on a stream whose
# access-policy window marks that call's input as PERSISTING (miss: STREAMING).
# Two effects the harness's flush (Quiet.flush: 2x L2 of *normal* writes) may not undo:
#  (a) persisting lines are not evicted by normal accesses, so the candidate's lines survive the flush
#      and the reference's whole window;
#  (b) if the set-aside is device-wide state (not saved/restored per context on a time-slice switch),
#      the reference's normal accesses get only L2 - set-aside (~12 MiB on H100) while the
#      candidate's stale persisting lines sit in the rest: the reference's second read of x misses.
#   HOLE: ok with speedup > 1.00 (e.g. 1.1-1.5) where the control scores 1.00; position_effect shows
#         reference_second_over_first > 1 (the reference is slower right after the candidate).
#   DEFENDED: 1.00 like the control (set-aside per context / flushed on switch / too small to matter).
import ctypes
import sys
import torch
import torch.nn as nn

_cu = ctypes.CDLL("libcuda.so.1")
CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE = 108
CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE = 109
CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1
NORMAL, STREAMING, PERSISTING = 0, 1, 2


class _Window(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class _Value(ctypes.Union):
    _fields_ = [("accessPolicyWindow", _Window), ("pad", ctypes.c_char * 64)]


def _attr(attr):
    v = ctypes.c_int()
    dev = ctypes.c_int()
    _cu.cuCtxGetDevice(ctypes.byref(dev))
    _cu.cuDeviceGetAttribute(ctypes.byref(v), attr, dev)
    return v.value


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.stream = None

    def _setup(self, device):
        torch.empty(1, device=device)  # context current
        self.setaside = _attr(CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE)
        self.max_window = _attr(CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE)
        rc = _cu.cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, ctypes.c_size_t(self.setaside))
        print(f"H3 set-aside {self.setaside >> 20} MiB (rc={rc}), max window {self.max_window >> 20} MiB",
              file=sys.stderr, flush=True)
        self.stream = torch.cuda.Stream()
        self.value = _Value()

    def _persist(self, x):
        n = min(x.numel() * x.element_size(), self.max_window)
        w = self.value.accessPolicyWindow
        w.base_ptr, w.num_bytes = x.data_ptr(), n
        w.hitRatio = min(1.0, self.setaside / max(n, 1))
        w.hitProp, w.missProp = PERSISTING, STREAMING
        _cu.cuStreamSetAttribute(ctypes.c_void_p(self.stream.cuda_stream), CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW,
                                 ctypes.byref(self.value))

    def forward(self, x):
        if self.stream is None:
            self._setup(x.device)
        cur = torch.cuda.current_stream()
        self.stream.wait_stream(cur)
        self._persist(x)
        with torch.cuda.stream(self.stream):
            out = x * x.mean()
        cur.wait_stream(self.stream)
        out.record_stream(cur)
        return out
