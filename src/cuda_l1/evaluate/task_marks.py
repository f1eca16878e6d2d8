"""Which tasks a worker process is preparing, kept where its pool can read it after the worker died.

A worker runs each task's own code (its import, its reference's first run) in its own process. A
task that ends that process (`os._exit`, a crash in native code) killed the worker; the pool took it
for the candidate's doing, retried, and after the second death stored a runtime_error verdict on
the candidate. The marks let the pool charge such a death to the task instead: its jobs go back
uncounted, and a task that kills a worker twice is bad input (BrokenTask), like any broken reference.

Only the task's own code is marked (its import, its reference's first run, its inputs, its shapes on the meta
device): a mark around all of a task's preparation also covered the waits and side starts during
which another candidate is judged. The marks live in shared memory written before the task's code
runs, so they are there even when the process ends at once: a message on the pool's queue would be
lost with the worker's feeder thread.

On a helper thread no deadline can interrupt the task's code (tasks/deadline.py), and a helper stuck
in it holds what the worker's every window needs (the device gate its preparation holds). There a
block still running after its limit ends the worker (STUCK_EXIT) with its mark standing, so the pool
charges the task as it does any death in its code.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import threading

SIZE = 1024  # bytes: room for dozens of task ids (12 hex characters each)
GRACE_S = 60.0  # a watched block's limit beyond its code's own deadlines: the work between them
STUCK_EXIT = 86  # the status of a worker ended because a task's code ran past its limit on a helper thread


class PreparingMarks:
    """Created by the pool for one worker process (`ctx`: the pool's multiprocessing context) and
    handed to it; the worker marks each task while it prepares it, the pool reads them after a death."""

    def __init__(self, ctx):
        # No cross-process lock: one only the worker takes could be held forever by a killed worker;
        # the pool reads after the worker is gone.
        self._shared = ctx.Array(ctypes.c_char, SIZE, lock=False)
        self._lock = threading.Lock()  # the worker's threads

    def __getstate__(self):
        return {"_shared": self._shared}

    def __setstate__(self, state):
        self._shared, self._lock = state["_shared"], threading.Lock()

    def _write(self, ids: list[str]) -> None:
        data = ",".join(ids).encode()[: SIZE - 1]
        self._shared[: len(data) + 1] = data + b"\0"

    @contextlib.contextmanager
    def preparing(self, task_id: str):
        """Mark `task_id` for the block (the worker's helper threads prepare tasks ahead, concurrently)."""
        with self._lock:
            ids = self.read()
            self._write(ids + [task_id])
        try:
            yield
        finally:
            with self._lock:
                ids = self.read()
                if task_id in ids:
                    ids.remove(task_id)
                self._write(ids)

    def read(self) -> list[str]:
        """The tasks being prepared (at a worker's death: those whose code was running)."""
        raw = bytes(self._shared[:]).split(b"\0", 1)[0]
        return [part for part in raw.decode(errors="replace").split(",") if part]

    def clear(self) -> None:
        self._write([])


_installed: PreparingMarks | None = None  # the worker process's own marks (install)


def install(marks: PreparingMarks | None) -> None:
    """In a pool worker: mark the tasks whose code runs in this process from now on."""
    global _installed
    _installed = marks


def in_worker() -> bool:
    """Whether this process is a pool worker (its marks installed)."""
    return _installed is not None


def running_task_code(task_id: str, limit_s: float | None = None):
    """Around the task's own code in a trusted process (its import, its reference's first run, its
    shapes on the meta device, its inputs): marked where a pool worker installed marks, else nothing.
    In a worker, on a thread other than the main one, a block still running after `limit_s` ends the
    worker (the main thread's own deadlines interrupt it instead)."""
    if _installed is None:
        return contextlib.nullcontext()
    if limit_s is None or not math.isfinite(limit_s) or threading.current_thread() is threading.main_thread():
        return _installed.preparing(task_id)
    return _watched(_installed, task_id, limit_s)


@contextlib.contextmanager
def _watched(marks: PreparingMarks, task_id: str, limit_s: float):
    finished = threading.Event()
    watch = threading.Timer(limit_s, lambda: finished.is_set() or _end_worker(task_id, limit_s))
    watch.daemon = True
    with marks.preparing(task_id):
        watch.start()
        try:
            yield
        finally:
            finished.set()
            watch.cancel()


def _end_worker(task_id: str, limit_s: float) -> None:
    os.write(2, f"cuda-l1 worker: task {task_id}'s own code ran past {limit_s:.0f} s on a helper thread, which no "
                f"deadline interrupts; this worker ends, and the pool charges the task\n".encode())
    os._exit(STUCK_EXIT)
