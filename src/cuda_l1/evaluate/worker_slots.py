"""How many evaluation workers a local pool starts, on which device each, and how one ended (in words).

A GPU worker times on a GPU of its own and a CPU worker on a core of its own (local_pool.py gives
each its timed core): more workers than that would share what they time on, and every verdict of
the run would carry the other workers' load. A request for more is cut to what the host has, and
the user is told so rather than left to wonder where the workers went.
"""

from __future__ import annotations

import os
import signal
import sys


def visible_gpus() -> int:
    """GPUs this process may use, counted without importing torch (devices.local_gpu_count): the pool
    counts them before it starts any worker."""
    from cuda_l1.devices import local_gpu_count

    try:
        return local_gpu_count()
    except Exception:
        return 0


def usable_cores() -> int:
    """Cores this process may run on (its affinity: a container's or taskset's limit, not the host's)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def worker_devices(device: str, workers: int | None) -> list[str]:
    """'cuda' -> one worker per visible GPU; 'cuda:N' -> that GPU; 'cpu' -> `workers` CPU workers, at
    most one per usable core. A `workers` beyond what the device has is cut, with a note on stderr."""
    if device in ("cuda", "auto") and visible_gpus():
        count = visible_gpus()
        return [f"cuda:{i}" for i in range(_cut(workers, count, f"{count} visible GPU(s)", default=count))]
    if device.startswith("cuda"):
        _cut(workers, 1, f"one device ({device})", default=1)
        return [device if ":" in device else "cuda:0"]
    cores = usable_cores()
    # One CPU worker by default: it leaves the host's other cores quiet for its own timed windows.
    return ["cpu"] * _cut(workers, cores, f"{cores} usable core(s), each CPU worker timing on one", default=1)


def _cut(workers: int | None, most: int, what: str, default: int) -> int:
    if workers is None:
        return default
    if workers > most:
        print(f"cuda-l1: --workers {workers} is more than {what}; starting {most}.", file=sys.stderr)
        return most
    return max(1, workers)


def exit_text(code: int | None) -> str:
    """How a worker process ended, in words: 'was killed by SIGKILL', 'exited with status 1'."""
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
