# reference: gpu_matmul
# expect: not_faster
# Work finished after the window. Each call queues its matmul on a stream that waits for a short
# host-to-device copy (about 0.5 ms) on another stream, and the harness's synchronisation is patched
# away, so the reply goes out at once. The parent's probe once took the device for idle beside such a
# copy (0.3 ms on an H100, benchmarks/gpu_hypotheses h1a, when its calibrated idle cost was unbounded):
# the window ended before any matmul ran. With the probe's idle cost bounded (quiet.IDLE_CAP_S) it waits
# for the queued work, ~18 ms a window on an H100, and the candidate is charged its full time (ok 0.95,
# benchmarks/results/2026-12-07-h100-settle-rate). Were the probe to miss it, the queued work would
# finish in time no side is charged for, or inside the reference's window: outputs read right after
# the window and again at the end of verification differ, and `outputs_settled` refuses it
# (settled_outputs.py; tests/test_settled_outputs.py on a CPU).
import torch
import torch.nn as nn

torch.cuda.synchronize = lambda *args, **kwargs: None  # the harness's device-wide synchronisation

DELAY_BYTES = 16 << 20


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.host = None

    def forward(self, a, b):
        if self.host is None:
            self.host = torch.empty(DELAY_BYTES, dtype=torch.uint8).pin_memory()
            self.dev = torch.empty(DELAY_BYTES, dtype=torch.uint8, device=a.device)
            self.copy_stream, self.work_stream = torch.cuda.Stream(), torch.cuda.Stream()
        current = torch.cuda.current_stream()
        out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
        self.copy_stream.wait_stream(current)
        with torch.cuda.stream(self.copy_stream):
            self.dev.copy_(self.host, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(self.copy_stream)
        self.work_stream.wait_stream(current)  # the inputs the parent wrote
        self.work_stream.wait_event(copied)  # behind the copy
        with torch.cuda.stream(self.work_stream):
            torch.matmul(a, b, out=out)
        for t in (out, a, b):
            t.record_stream(self.work_stream)
        return out
