"""A deadline on a task's own code where it runs in a trusted process.

The evaluator imports the task's module, builds its model and inputs and runs its reference once in
its own process (the inputs of every round are made there), and `tasks show` and the reference
checks of `bench` and `audit` do the same. A task file that sleeps, waits for input or loops forever
at import hung the whole command, with no deadline: `--timeout` bounds a candidate's evaluation, not
the task's preparation. Past `seconds`, the task is reported broken (a TaskError naming its file).

How the code is stopped:
- on the main thread, a signal of our own is sent to it: a blocking call (sleep, a read) is
  interrupted and a Python loop stops at its next instruction;
- on another thread (a GPU worker prepares tasks ahead on helper threads), an asynchronous exception
  is set on it: a Python loop stops, but a call blocked in C returns first. That is the limit.

Code running inside one of torch's C++ operators is never interrupted: it is stopped when the
operator returns. The exception derives from BaseException, so a task's `except Exception` does not
swallow it; it is sent again every second, but a bare `except:` around a loop swallows every one.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import signal
import threading

from cuda_l1.errors import TaskError

DEFAULT_TASK_TIMEOUT_S = 300.0
RESEND_S = 1.0  # after the deadline, how often the stop is sent again (a bare `except:` swallowed one)
# A real-time signal of our own: SIGALRM belongs to whatever else runs in the process (pytest-timeout).
_SIGNAL = signal.SIGRTMIN + 2 if hasattr(signal, "SIGRTMIN") else signal.SIGALRM


class _Expired(BaseException):
    """Raised inside the task's code at its deadline; becomes a TaskError at the deadline's edge."""


_armed: set[int] = set()  # thread idents whose deadline has passed and is still in force
_lock = threading.Lock()


def _on_signal(signum, frame) -> None:
    with _lock:
        expired = threading.get_ident() in _armed
    if expired:
        raise _Expired()


def _stop(ident: int, main: bool) -> None:
    if main:
        signal.pthread_kill(ident, _SIGNAL)
    else:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(_Expired))


@contextlib.contextmanager
def task_deadline(seconds: float | None, what: str, origin: str):
    """Run the block (the task's own code) for at most `seconds`; past it, raise TaskError saying that
    `what` ("importing the task", "its reference's first run") took too long. None or <= 0: no limit."""
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        yield
        return
    ident = threading.get_ident()
    main = threading.current_thread() is threading.main_thread()
    finished = threading.Event()
    if main:  # for good: a stop sent just as the block ended must never meet the default action (exit)
        signal.signal(_SIGNAL, _on_signal)

    def watch() -> None:
        wait = seconds
        while not finished.wait(wait):
            with _lock:
                if finished.is_set():
                    return
                _armed.add(ident)
                _stop(ident, main)
            wait = RESEND_S

    watcher = threading.Thread(target=watch, name="cuda-l1-task-deadline", daemon=True)
    watcher.start()
    try:
        yield
    except _Expired:
        raise TaskError(f"{what} ran past its deadline of {seconds:g} s (a task's own code must finish; "
                        "does it sleep, wait for input or loop forever?)", path=origin) from None
    finally:
        with _lock:
            finished.set()
            if ident in _armed:
                _armed.discard(ident)
                if not main:  # a stop sent but not yet raised is withdrawn
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)
        watcher.join()
