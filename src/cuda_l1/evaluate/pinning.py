"""Pinning a stopped side to one core, from outside.

Why: on a GPU, unpinned, a candidate that kept a helper process spinning on another core ran a
launch-bound task 30% faster on an H200 (a busy core keeps the CPU in a faster power state), a speed
the reference, stopped beside it, never had. With every thread of both sides on one core, CPU a side
burns beside its calls comes out of its own calls. The side's seccomp filter forbids it to change
its affinity back (seccomp.py), and threads and processes it starts later inherit the pin.
"""

from __future__ import annotations

import os


def _set_affinity(side, cores: set[int]) -> int:
    """Every thread of the stopped `side` on `cores`; the number set (raises OSError: no permission, a core
    outside the cpuset)."""
    done = 0
    for pid in side.tree():
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue  # the process ended
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cores)
                done += 1
            except ProcessLookupError:
                pass  # the thread ended
    return done


def pin_side(side, core: int) -> int:
    """Pin every thread of the stopped `side` (a SideProcess) to `core`; the number pinned. Called
    while the side is stopped, so no thread can start between listing and pinning. `side.pinned_core`
    is set only once every thread is pinned (a failed pin is tried again next time)."""
    try:
        pinned = _set_affinity(side, {core})
    except OSError as exc:  # an unprivileged parent and a side of another uid; a core outside a cpuset
        side.notes["cpu_core"] = f"not enforced: {exc.strerror}"
        side.pinned_core = None  # tried again before the next window (task_env.pin_for_timing)
        return 0
    side.pinned_core = core
    side.notes["cpu_core"] = f"{core} while timed (every thread pinned by the parent after the first window)"
    return pinned


def spread_side(side, cores: set[int]) -> bool:
    """Let every thread of the stopped, pinned `side` run on `cores` for one untimed request; True when
    it did, and then the caller pins it back (pin_side to `side.pinned_core`) once it is stopped again.

    Why: the reference's float64 oracle falls back to the CPU where the device has no room for it (a
    6 GiB KernelBench input is 36 GiB in float64 with its output and temporaries; beside a CUDA-graph
    candidate's static buffers an 80 GiB GPU has not), and on the one core of its pin that took 10-25 s
    a round (benchmarks/results/2026-12-07-h100-oracle-fallback). No window runs while the side is
    spread: every thread is pinned again before the next one, and the oracle's CPU threads end with the
    thread it ran on (oracle_run.on_threads), so none is left beside the reference's windows."""
    if side.pinned_core is None or len(cores) < 2:
        return False
    try:
        _set_affinity(side, set(cores))
    except OSError:  # some threads may be spread already: all of them back on the core
        pin_side(side, side.pinned_core)
        return False
    return True


def gpu_worker_cores(workers: list[str], index: int, cores: list[int]) -> tuple[int, tuple[int, ...]]:
    """A GPU worker's timed core and the other GPU workers' (its busy_cores). GPU workers pin their sides
    after the first window, each to a core of its own (not the first, which often serves interrupts),
    so workers on different GPUs do not share one; a reference side spread over the cores for its
    float64 oracle (pinning.spread_side) keeps off the others', whose windows may be running."""
    timed = {cores[(i + 1) % len(cores)] for i, kind in enumerate(workers) if kind != "cpu"}
    mine = cores[(index + 1) % len(cores)]
    return mine, tuple(sorted(timed - {mine}))
