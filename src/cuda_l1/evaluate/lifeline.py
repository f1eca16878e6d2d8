"""A worker's lifeline: an evaluation worker dies with the process that owns its pool.

Between candidates a worker blocks on its inbox. When its owner (`cuda-l1 optimize`, a training stage)
is killed with SIGKILL, no `close()` runs and nobody sends the stop message, so without a lifeline the
worker would wait forever, holding prepared references (gigabytes) and, mid-candidate, a sandboxed
child and a GPU. Two mechanisms, because neither alone covers every case:

- Linux: `prctl(PR_SET_PDEATHSIG, SIGKILL)`. The kernel kills the worker when the *thread* that started
  it exits, with no help from the worker's Python code (which may be busy). So the pool starts its
  workers from a thread that lives as long as the pool (its dispatcher), never from a caller's thread.
- Everywhere: a watchdog thread that waits on multiprocessing's parent sentinel (a pipe that reaches
  end-of-file when the owner exits, however it exits) and also notices a changed parent pid (the
  worker was re-parented). It kills its own process the same way, with SIGKILL.

The worker's sandboxed children set their own parent-death signal, so they follow the worker.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1
_POLL_S = 1.0  # how often the watchdog also compares the parent pid (for a sentinel that never fires)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _set_parent_death_signal() -> bool:
    """Ask the kernel for SIGKILL when the starting thread exits (Linux only); whether it worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(owner_pid: int, sentinel: int | None) -> None:
    while True:
        if sentinel is not None:
            if multiprocessing.connection.wait([sentinel], timeout=_POLL_S):
                _die()
        else:
            threading.Event().wait(_POLL_S)
        if os.getppid() != owner_pid:
            _die()


def hold(owner_pid: int) -> dict:
    """Tie this process's life to `owner_pid`, the process that started it; call first thing in a worker.

    Returns which mechanisms are in place (for tests and logs). Exits at once when the owner is
    already gone (it may have died before the signal was armed).
    """
    armed = _set_parent_death_signal()
    if os.getppid() != owner_pid:
        _die()
    parent = multiprocessing.parent_process()
    sentinel = getattr(parent, "sentinel", None) if parent is not None else None
    threading.Thread(target=_watch, args=(owner_pid, sentinel), name="cuda-l1-lifeline", daemon=True).start()
    return {"parent_death_signal": armed, "sentinel": sentinel is not None, "owner_pid": owner_pid}
