"""A deadline on a task's own code where it runs in a trusted process's main thread.

The evaluator imports the task's module, builds its model and inputs and runs its reference once in
its own process (the inputs of every round are made there), and `tasks show` and the reference
checks of `bench` and `audit` do the same. A task file that sleeps, waits for input or loops forever
at import hung the whole command, with no deadline: `--timeout` bounds a candidate's evaluation, not
the task's preparation. Past `seconds`, the task is reported broken (a TaskError naming its file).

How the code is stopped: a real-time signal of the evaluator's own is sent to the main thread, whose
handler raises inside the task's code; a blocking call (a sleep, a read) is interrupted and a Python
loop stops at its next instruction. The handler never raises once the block has ended, nor while
this module's own code runs (entering or leaving the block), so no stop lands in other code. The
stop derives from BaseException, so a task's `except Exception` does not swallow it; it is sent
again every second, but a bare `except:` around a loop swallows every one.

Limits: code inside one of torch's operators is stopped when the operator returns. On other threads
(a GPU worker prepares tasks ahead on helper threads) nothing is interrupted: an exception raised
asynchronously in another thread can land after its block has ended, in code that is not the
task's; there the worker's own wait for a task being prepared is bounded instead (jobs.Evaluators).
Where the platform has no real-time signals, nothing is interrupted either (SIGALRM belongs to
whatever else runs in the process, pytest-timeout among them).
"""

from __future__ import annotations

import math
import signal
import threading

from cuda_l1.errors import TaskError

DEFAULT_TASK_TIMEOUT_S = 300.0
# After the deadline, how often the stop is sent again. The stop is a BaseException, so no
# `except Exception` swallows it; a resend covers a signal handled while this module's own frames were
# on the stack (the handler raises nothing there), and a bare `except:` in the task's code swallowing one.
RESEND_S = 1.0
_SIGNAL = signal.SIGRTMIN + 2 if hasattr(signal, "SIGRTMIN") else None


class _Expired(BaseException):
    """Raised inside the task's code at its deadline; a TaskError at the deadline's edge."""


def is_deadline_stop(exc: BaseException) -> bool:
    """Whether `exc` is a deadline's stop on its way to its `task_deadline` (never the task's failure)."""
    return type(exc) is _Expired  # (exact: a subclass is the task's own, as is_task_failure reads it)


class _Deadline:
    """One block's deadline (main thread only)."""

    def __init__(self, seconds: float, what: str, origin: str):
        self.seconds, self.what, self.origin = seconds, what, origin
        self.passed = False  # the deadline has passed: the handler may raise
        self.done = False  # the block has ended: the handler never raises again
        self.wake = threading.Event()

    def watch(self) -> None:
        wait = self.seconds
        while not self.wake.wait(wait) and not self.done:
            self.passed = True
            signal.pthread_kill(threading.main_thread().ident, _SIGNAL)
            wait = RESEND_S


_current: _Deadline | None = None  # the main thread's block under a deadline (blocks do not nest)


def _on_signal(signum, frame) -> None:
    deadline = _current
    if deadline is None or deadline.done or not deadline.passed:
        return
    while frame is not None:  # this module's own code (entering, leaving) is never interrupted
        if frame.f_globals is globals():
            return
        frame = frame.f_back
    raise _Expired()


class task_deadline:  # noqa: N801 - used as a context manager, like contextlib's
    """Run the block (the task's own code) for at most `seconds`; past it, raise TaskError saying that
    `what` ("importing the task", "the reference's first run") took too long. None or <= 0, another
    thread than the main one, a block inside another's, or no real-time signals: no limit."""

    def __init__(self, seconds: float | None, what: str, origin: str):
        self.deadline: _Deadline | None = None
        if (seconds is None or not math.isfinite(seconds) or seconds <= 0 or _SIGNAL is None
                or threading.current_thread() is not threading.main_thread()):
            return
        self.deadline = _Deadline(seconds, what, origin)

    def __enter__(self) -> "task_deadline":
        global _current
        if _current is not None:  # inside another block under a deadline: this one has no limit
            self.deadline = None
        if self.deadline is None:
            return self
        signal.signal(_SIGNAL, _on_signal)  # for good: a late stop must never meet the default action
        watcher = threading.Thread(target=self.deadline.watch, name="cuda-l1-task-deadline", daemon=True)
        _current = self.deadline
        try:
            watcher.start()
        except BaseException:  # no watcher (no threads left): no limit, and none left set for later blocks
            _current, self.deadline = None, None
            raise
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        global _current
        deadline = self.deadline
        if deadline is None:
            return False
        deadline.done = True  # from here no stop is raised (and this frame is this module's)
        deadline.wake.set()
        _current = None
        if kind is _Expired:
            raise TaskError(f"{deadline.what} ran past its deadline of {deadline.seconds:g} s (a task's own code "
                            "must finish; does it sleep, wait for input or loop forever?)", path=deadline.origin) from None
        return False

