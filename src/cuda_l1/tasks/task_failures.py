"""Which exceptions out of a task's own code are the task's failure (bad input), and their words.

A task's code runs in trusted processes (the caller, a pool worker) to build its reference, inputs and
model. What it raises there must become the task's error, never a dead worker (whose candidate was
blamed for the deaths) nor a traceback; and what it raises must not be mistaken for the run's own
stops (Ctrl-C, a deadline's stop), nor its words (`__str__`) be trusted to behave.
"""

from __future__ import annotations

from cuda_l1.tasks.deadline import is_deadline_stop

# What the task's own code may raise that is its failure, not the run's: anything (SystemExit: sys.exit() at
# import or in get_inputs ended `cuda-l1 eval` with no output and status 0; a class of its own derived from
# BaseException ended a worker, whose candidate was then blamed for its deaths), but for what is not the
# task's: Ctrl-C, and the stop of its own deadline (tasks/deadline.py), which its caller turns into words.
# Caught as `except TASK_FAILURES as exc:` followed by `if not is_task_failure(exc): raise`.
TASK_FAILURES = BaseException


def is_task_failure(exc: BaseException) -> bool:
    """Whether an exception caught around the task's own code is the task's failure (see TASK_FAILURES).
    By exact type: Ctrl-C raises KeyboardInterrupt itself, never a subclass, and `isinstance` believes
    an object's own `__class__`, which the task's code may set."""
    return type(exc) is not KeyboardInterrupt and not is_deadline_stop(exc)


def escaped_task_failure(exc: BaseException, in_worker: bool) -> bool:
    """Whether what escaped a block of the task's own code whole (past every handler: a class of the task's
    derived from BaseException, raised where task objects are used after a call, or by a `__str__`) is the
    task's failure. An Exception is left to its caller. In a pool worker, which ignores SIGINT, even a
    KeyboardInterrupt itself can only be the task's."""
    if issubclass(type(exc), Exception):
        return False
    if type(exc) is KeyboardInterrupt:
        return in_worker
    return not is_deadline_stop(exc)


def describe_exception(exc: BaseException, limit: int = 2000) -> str:
    """'ValueError: boom', where the exception is the task's code's: its own `__str__` may raise anything,
    and what it raises must not replace the failure being reported."""
    try:
        name = type(exc).__name__
        name = name if isinstance(name, str) else "an exception"
    except BaseException:  # noqa: BLE001 - a metaclass of the task's
        name = "an exception"
    try:
        text = str(exc)
        if not isinstance(text, str):
            raise TypeError
    except BaseException:  # noqa: BLE001 - its words are the task's code too
        return f"{name} (whose message could not be read)"[:limit]
    return f"{name}: {text}"[:limit]
