"""One timed call, measured identically for the reference (in the parent) and the candidate (in the
child): fresh inputs regenerated outside the window, cache flushed, CUDA events on the harness stream,
and a device-wide synchronisation whose wall time catches work left running on other streams.

The primitives are bound at import time, before any candidate code runs, so a candidate that patches
`torch.cuda.Event` or `time.perf_counter_ns` later does not change what the harness measures (and the
child reports such patching as a failed check).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

_perf_ns = time.perf_counter_ns
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
_cuda_sync = torch.cuda.synchronize


@dataclass
class CallTime:
    event_ms: float | None  # GPU time between events on the harness stream (None on CPU)
    wall_ms: float  # host time from before launch to after a device-wide synchronisation


class Flusher:
    """Evicts caches between timed calls by writing a buffer at least twice the last-level cache."""

    def __init__(self, device: str, nbytes: int):
        self.device = device
        self.buffer = torch.empty(max(nbytes // 4, 1), dtype=torch.int32, device=device) if nbytes > 0 else None

    def flush(self) -> None:
        if self.buffer is not None:
            self.buffer.fill_(0x5A5A)


def flush_bytes(device: str) -> int:
    """2x the L2 on CUDA devices; 2x the LLC (capped) on CPU."""
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        l2 = getattr(props, "L2_cache_size", 0) or 50 * 2**20
        return 2 * l2
    try:
        for index in range(4, -1, -1):
            path = f"/sys/devices/system/cpu/cpu0/cache/index{index}/size"
            with open(path) as fh:
                text = fh.read().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1], 1)
            size = int(text.rstrip("KMG")) * scale
            return min(2 * size, 256 * 2**20)
    except (OSError, ValueError):
        pass
    return 32 * 2**20


# glibc serves large blocks with fresh mmap()s until a freed one raises its threshold (up to 32 MiB),
# so the same forward can page-fault on every call in one process and reuse heap memory in another:
# identical code then timed 25% apart on CPU, depending on what each process had allocated before.
# On a CPU device both sides pin the policy instead: blocks below 256 MiB come from the heap, which
# is kept. (On a GPU the timed work is on the device; the host policy is left alone there.)
_MMAP_THRESHOLD = 256 << 20
_TRIM_THRESHOLD = 1 << 30


def steady_host_allocator() -> bool:
    """Give this process the same host-allocator policy as the other side (glibc only; else a no-op)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(mallopt(M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        _cuda_sync()


def time_call(fn, args: list, device: str, flusher: Flusher | None):
    """Run fn(*args) once inside the timed window; return (output, CallTime)."""
    if flusher is not None:
        flusher.flush()
    if device.startswith("cuda"):
        stream = torch.cuda.current_stream()
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _cuda_sync()
        t0 = _perf_ns()
        _event_record(start, stream)
        out = fn(*args)
        _event_record(end, stream)
        _cuda_sync()  # device-wide: work hidden on other streams is waited for
        t1 = _perf_ns()
        return out, CallTime(event_ms=_event_elapsed(start, end), wall_ms=(t1 - t0) / 1e6)
    t0 = _perf_ns()
    out = fn(*args)
    t1 = _perf_ns()
    return out, CallTime(event_ms=None, wall_ms=(t1 - t0) / 1e6)
