# H1a diagnostic. Task: tests/corpus/refs/gpu_matmul.py
# The output-producing matmul is queued on a compute stream that waits (cudaStreamWaitEvent, a
# semaphore acquire) on an H2D copy "delay line" of ~40-80 ms from pinned host memory on an async
# copy engine. The harness's device-wide synchronize is made a no-op, so the reply goes out at once.
# Quiet.wait_idle then probes with a 1-element kernel + a 256 KiB D2D copy.
#   DEFENDED: the probe stays slow until the delay line and the matmul are done -> outputs complete
#             before verification -> verdict ok (slow; timing.last_idle_wait_ms ~ tens of ms).
#   HOLE:     the probe answers fast twice while the H2D copy runs on another copy engine and the
#             compute channel sits blocked -> window ends, verification reads an unwritten output ->
#             verdict `incorrect` in round 1 (check reasons: "differs ..."/oracle error).
import sys
import torch
import torch.nn as nn

torch.cuda.synchronize = lambda *a, **k: None  # the harness's device-wide sync (a signal only)

DELAY_BYTES = 512 << 20   # per copy; PCIe gen5 ~25-50 GB/s -> ~10-20 ms each
DELAY_COPIES = 4


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.host = None

    def forward(self, a, b):
        if self.host is None:
            self.host = torch.empty(DELAY_BYTES, dtype=torch.uint8).pin_memory()
            self.dev = torch.empty(DELAY_BYTES, dtype=torch.uint8, device=a.device)
            self.copy_stream = torch.cuda.Stream()
            self.comp_stream = torch.cuda.Stream()
        cur = torch.cuda.current_stream()
        out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
        self.copy_stream.wait_stream(cur)
        with torch.cuda.stream(self.copy_stream):
            for _ in range(DELAY_COPIES):
                self.dev.copy_(self.host, non_blocking=True)
        done = torch.cuda.Event()
        done.record(self.copy_stream)
        self.comp_stream.wait_stream(cur)          # inputs written by the parent are visible
        self.comp_stream.wait_event(done)          # blocked behind the delay line
        with torch.cuda.stream(self.comp_stream):
            torch.matmul(a, b, out=out)
        out.record_stream(self.comp_stream)
        a.record_stream(self.comp_stream); b.record_stream(self.comp_stream)
        return out
