"""How launch-bound a task's reference is on a GPU, and so how far its timing can stray between processes.

A forward whose kernels are short waits on the CPU that issues them: its time is the issuing
process's Python and dispatcher work, which differs from one process to the next with where its
memory landed, as a CPU side's does. Identical code on such a task (tests/corpus/refs/many_small_ops.py,
thirty small kernels a call, 0.22 ms) read 0.95-1.13 over six pairs of processes on an H100,
each with a rounds' interval of about +-2%; a forward of long kernels hides its issuing process behind
the device's queue, and identical code over the built-in suite strays by 0.3-0.7%.

The share is measured on the reference's run in the trusted process (the task's own code, never the
candidate's): the time until a call returns over the time until the device has finished it. Near 1
the device waited on the CPU; near 0 the CPU waited on the device. A forward that synchronises inside
(`.item()`, a host copy) reads near 1 too: its interval is widened as a launch-bound one's, which can
only move a score toward 1.00. The largest of a few calls is taken: other work on the device (a
worker prepares tasks beside another's verification) lengthens a call's device time and lowers its
share, and a low share is the one that narrows the interval. A forward slower than SLOW_S is not
measured (its calls would eat into the first run's deadline; one that slow is not launch-bound)."""

from __future__ import annotations

import time
from typing import Callable

CALLS = 3  # measured calls after the first run (its own cold start excluded): the largest share is taken
BUDGET_S = 1.0  # no more calls once this much time went on them (a slow forward gets one)
SLOW_S = 1.0  # a first call slower than this: no share (None, the device's spread)


def launch_share(call: Callable[[], object], device: str) -> float:
    """The largest over up to CALLS calls of (time until `call` returns) / (time until the device is done
    with it), in [0, 1]. `call` runs the forward; its output is dropped before the next call."""
    import torch

    torch.cuda.synchronize(device)
    shares, spent = [], 0.0
    while len(shares) < CALLS and (not shares or spent < BUDGET_S):
        start = time.perf_counter()
        out = call()
        issued = time.perf_counter()
        torch.cuda.synchronize(device)
        done = time.perf_counter()
        del out
        shares.append(min(1.0, (issued - start) / max(done - start, 1e-9)))
        spent += done - start
    return max(shares)


def spread_for(share: float | None, device_spread: float, launch_bound_spread: float) -> float:
    """The spread between processes of a task whose reference has `share` (None: not measured, the
    device's own): the device's spread for a forward the device paces, the launch-bound spread for
    one the CPU paces, and the line between them for what lies between."""
    if share is None:
        return device_spread
    share = min(max(share, 0.0), 1.0)
    return device_spread + share * max(launch_bound_spread - device_spread, 0.0)
