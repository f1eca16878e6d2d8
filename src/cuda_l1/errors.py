"""Errors a user can act on. The CLI prints them as one paragraph: exit code 2 for bad input, 1 for a
run that could not do its work."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (a file, a flag, a config): shown without a traceback, exit code 2."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        self.path = path
        self.line = line
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)


class TaskError(UserError):
    """A task source that is not a usable KernelBench-format task."""


class BrokenTask(TaskError):
    """A task whose reference failed when an evaluation worker ran it once, in its own trusted process,
    before judging any candidate of it: the one failure a worker reports as the task's (bad input that
    ends a bench), since no candidate's code has run in that process (evaluate/task_env.py)."""


class RunError(Exception):
    """The run itself failed (an endpoint that never answered, say): one paragraph, exit code 1.

    Bad input is a UserError (exit 2); this is for input that was fine but whose work did not get done."""

    exit_code = 1
