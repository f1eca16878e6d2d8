"""Between windows, from the parent's own process: wait until the device is idle, then flush caches.

A stopped process's queued GPU kernels keep running, and the GPU time-slices between processes, so a
one-element kernel launched from the parent's own CUDA context answers in ~20 us on an idle GPU but
takes a time slice (~2 ms on an H200) while another context still has work (measured:
benchmarks/results/2026-12-01-h200-isolation). `wait_idle` probes until two answers in a row come
back at idle speed; the time it took is part of the window that just ended. The cache flush writes a
buffer twice the last-level cache, outside both windows, so neither side finds the other's data (or
its own from an earlier window) cached.
"""

from __future__ import annotations

import os
import time

import torch


def flush_bytes(device: str) -> int:
    """2x the L2 on CUDA devices; 2x the last-level cache (capped) on CPU."""
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return 2 * (getattr(props, "L2_cache_size", 0) or 50 * 2**20)
    for index in range(4, -1, -1):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as fh:
                text = fh.read().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1], 1)
            return min(2 * int(text.rstrip("KMG")) * scale, 256 * 2**20)
        except (OSError, ValueError):
            continue
    return 32 * 2**20


IDLE_CAP_S = 100e-6  # the most an idle probe is taken to cost, whatever the calibration measured


class Quiet:
    """The parent's probe and flush for one device."""

    def __init__(self, device: str, flush: bool = True, core: int | None = None):
        self.device = device
        self.core = core
        self.gpu = device.startswith("cuda")
        self.idle_s = 0.0
        self.buffer = torch.empty(flush_bytes(device) // 4, dtype=torch.int32, device=device) if flush else None
        if self.gpu:
            self.one = torch.zeros(1, device=device)
            # A probe kernel shows pending compute in another context; a small device-to-device copy
            # goes to the copy engines, so pending copies (a side's hidden delay line) show too.
            self.src, self.dst = torch.zeros(1 << 16, device=device), torch.empty(1 << 16, device=device)
            samples = sorted(self._probe() for _ in range(40))
            # Bounded: calibrated while a candidate's queued work kept the device busy, an unbounded
            # median would let every later window end on a busy device (3 x 100 us + 20 us is still far
            # below a time slice of another context, about 2 ms; an idle H100 answers in about 32 us).
            self.idle_s = min(samples[len(samples) // 2], IDLE_CAP_S)

    def _probe(self) -> float:
        t0 = time.perf_counter()
        self.one.add_(1.0)
        self.dst.copy_(self.src)
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def wait_idle(self, timeout_s: float) -> float:
        """Seconds until two probes in a row answer at idle speed (0 on CPU)."""
        if not self.gpu:
            return 0.0
        start = time.perf_counter()
        fast, threshold = 0, 3 * self.idle_s + 20e-6
        while fast < 2:
            fast = fast + 1 if self._probe() < threshold else 0
            if time.perf_counter() - start > timeout_s:
                raise TimeoutError("the device stayed busy after the window")
        return time.perf_counter() - start

    def flush(self) -> None:
        if self.buffer is None:
            return
        if self.gpu:
            self.buffer.fill_(0x5A5A)
            torch.cuda.synchronize(self.device)
            return
        if self.core is not None and hasattr(os, "sched_setaffinity"):
            allowed = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {self.core})  # the core the sides are timed on: its caches
            try:
                self.buffer.fill_(0x5A5A)
            finally:
                os.sched_setaffinity(0, allowed)
        else:
            self.buffer.fill_(0x5A5A)
