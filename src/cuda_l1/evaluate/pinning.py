"""Pinning a stopped side to one core, from outside.

Why: on a GPU, unpinned, a candidate that kept a helper process spinning on another core ran a
launch-bound task 30% faster on an H200 (a busy core keeps the CPU in a faster power state), a speed
the reference, stopped beside it, never had. With every thread of both sides on one core, CPU a side
burns beside its calls comes out of its own calls. The side's seccomp filter forbids it to change
its affinity back (seccomp.py), and threads and processes it starts later inherit the pin.
"""

from __future__ import annotations

import os


def pin_side(side, core: int) -> int:
    """Pin every thread of the stopped `side` (a SideProcess) to `core`; the number pinned. Called
    while the side is stopped, so no thread can start between listing and pinning. `side.pinned_core`
    is set only once every thread is pinned (a failed pin is tried again next time)."""
    pinned = 0
    for pid in side.tree():
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue  # the process ended
        for tid in tids:
            try:
                os.sched_setaffinity(tid, {core})
                pinned += 1
            except ProcessLookupError:
                pass  # the thread ended
            except PermissionError as exc:  # an unprivileged parent and a side of another uid
                side.notes["cpu_core"] = f"not enforced: {exc.strerror}"
                return pinned
    side.pinned_core = core
    side.notes["cpu_core"] = f"{core} while timed (every thread pinned by the parent after the first window)"
    return pinned
