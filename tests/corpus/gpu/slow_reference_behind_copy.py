# reference: gpu_matmul
# expect: not_faster
# The reference's own math, computed inside the window and synchronised on the current stream; then, on
# another stream, a few more products of the same size queued behind a 16 MiB host-to-device copy, and the
# harness's device-wide synchronisation patched to the current stream only. The extra work starts after the
# window has ended and writes nothing the verifier reads: when the reference's window comes next, the two
# share the GPU and the reference is charged for both. It writes no output, so settled_outputs.py cannot
# see it; what does is the parent's idle probe, its idle cost bounded (quiet.IDLE_CAP_S): it waits for
# the queued work, which is then charged to the candidate's window. Not faster in two runs on an H100
# (it was an open case until then: XPASS, benchmarks/results/2026-12-07-h100-settle-rate).
import torch
import torch.nn as nn

torch.cuda.synchronize = lambda *args, **kwargs: torch.cuda.current_stream().synchronize()

DELAY_BYTES = 16 << 20
EXTRA = 4  # products queued after each window's first call


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.host = None

    def forward(self, a, b):
        out = a @ b
        if self.host is None:
            self.host = torch.empty(DELAY_BYTES, dtype=torch.uint8).pin_memory()
            self.dev = torch.empty(DELAY_BYTES, dtype=torch.uint8, device=a.device)
            self.copy_stream, self.extra_stream = torch.cuda.Stream(), torch.cuda.Stream()
            self.scratch = torch.empty_like(out)
            self.calls = 0
        self.calls += 1
        if self.calls % 8 == 1:  # not every call: the extra work must outlast the window, not fill it
            with torch.cuda.stream(self.copy_stream):
                self.dev.copy_(self.host, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.copy_stream)
            self.extra_stream.wait_event(copied)
            with torch.cuda.stream(self.extra_stream):
                x = torch.randn_like(self.scratch)
                for _ in range(EXTRA):
                    torch.matmul(x, x, out=self.scratch)
        return out
