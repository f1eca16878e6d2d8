"""The contract every evaluation pool keeps, shared by the local and the Ray backend.

It lives apart from both backends (and from the `make_pool` factory in pool.py) so that each backend
depends on it alone and neither imports the other: the job and result types, the `EvalPool`
interface, the runtime_error verdict a pool answers with when it cannot judge a job, and the
evaluators a worker holds (`Evaluators`), which local worker processes and Ray actors keep alike.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import math
import queue
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from cuda_l1.errors import BrokenTask
from cuda_l1.evaluate.verdict import RUNTIME_ERROR, Check, Verdict
from cuda_l1.tasks import Task, code_id


@dataclass
class EvalJob:
    """One candidate to judge."""

    task: Task
    source: str
    key: str = ""  # the caller's handle (defaults to the candidate's id, tasks.code_id)
    best_known_speedup: float | None = None  # for the re-measure rule
    thresholds: tuple[float, ...] = ()  # speedups the caller decides at: timing may stop once clear of them
    meta: dict = field(default_factory=dict)  # passed back untouched (origin, strategy, ...)

    def __post_init__(self):
        if not self.key:
            self.key = code_id(self.source)


@dataclass
class EvalResult:
    job: EvalJob
    verdict: Verdict
    worker: str  # which worker judged it (device, host); NO_WORKER when the pool gave up on the job
    attempts: int = 1

    @property
    def judged(self) -> bool:
        """Whether a worker judged the candidate (not so when the pool closed or became unusable first:
        such a verdict says nothing of the candidate and is not stored)."""
        return self.worker != NO_WORKER


NO_WORKER = "none"  # EvalResult.worker of a job the pool answered without judging it
# A worker's answer in place of a verdict when the job's task, not its candidate, failed: its reference
# failed its one run in the worker's own process (BrokenTask, TaskEnv). The job's future ends with a
# BrokenTask carrying the message (bad input for the caller to report), and no verdict is stored: no
# candidate is blamed for its task. Failures in the sandbox are verdicts, judged again later.
TASK_ERROR = "task_error"


def failed_verdict(job: EvalJob, message: str, *, evaluation_failed: bool = True) -> Verdict:
    """A verdict the pool gives when no evaluation finished. `evaluation_failed`: the failure is the
    pool's or the evaluator's (a failed `evaluator` check: the verdict is not settled, see
    Verdict.settled); False when the candidate is its likely cause (its worker died every time)."""
    checks = [Check("evaluator", False, message[:500])] if evaluation_failed else []
    return Verdict(status=RUNTIME_ERROR, reasons=[message], task_id=job.task.id, task_name=job.task.key,
                   candidate_id=code_id(job.source), checks=checks)


KEEP_REFERENCES = 2  # prepared references a worker holds: a task's candidates back to back, and one more


def deliver(future: Future, result=None, error: BaseException | None = None) -> None:
    """Resolve a job's future once; a future its caller cancelled (or one already resolved) is left
    as it is: raising here, in a pool's dispatcher, would fail every other job."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


class PreparationWait(BrokenTask):
    """A task another thread of the worker prepares for longer than a worker waits: the task's error for
    the job that waited, but not proof that its reference fails (crowding.prepare does not remember it)."""


class Evaluators:
    """The evaluators a worker holds: one per task, for the `keep` tasks it judged most recently.

    An evaluator holds its task's prepared reference (module, inputs, float64 oracle outputs) and
    maybe a spare child; a worker that kept one per task grew to 5-6 GB over the built-in suite. Older
    ones are closed (`Evaluator.close()`) and dropped before a new one is prepared, so at most `keep`
    exist at any moment (more only while more tasks are `busy`); a task that comes back is prepared
    again, which costs seconds, not memory.

    Thread-safe: a worker's helper threads prepare the tasks of candidates they load ahead
    (lookahead.py) while its main thread judges. An evaluator of a `busy` task (one a queued or
    running job needs) is never closed, and one being prepared is waited for, not prepared twice.
    """

    def __init__(self, make: Callable[[Task], Any], keep: int = KEEP_REFERENCES, quiet_lock=None, room=None,
                 wait_s: float | None = None):
        self.make = make  # task -> Evaluator
        self.keep = max(1, keep)
        # How long to wait for a task another thread prepares: a task's code on a helper thread cannot
        # be interrupted (tasks/deadline.py), and one that never ends would hold this worker for good.
        self.wait_s = wait_s if wait_s is not None and math.isfinite(wait_s) else None
        # On a GPU (device_room.DeviceRoom): a task prepared without room on the device for it first
        # retires every held evaluator that no busy task needs, and `fits` tells a load ahead to wait.
        self.room = room
        # Held while retired evaluators are closed and collected (a worker's SideSupply.gate: their
        # reference sides exit and the collector holds the interpreter, never beside a timed window).
        self.quiet_lock = quiet_lock if quiet_lock is not None else contextlib.nullcontext()
        self._held: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._changed = threading.Condition()
        # task id -> why its reference does not run (crowding.prepare): its other jobs are answered at once
        self.broken: dict[str, str] = {}
        # task id -> how its last preparation failed (BrokenTask), for the threads that waited for it: a
        # load ahead of the task's next candidate must not run a failed reference again (crowding.prepare
        # decides whether it is tried once more, alone)
        self._failed: dict[str, str] = {}

    def get(self, task: Task, busy: Iterable[str] = ()):
        busy = set(busy) | {task.id}
        retired = []
        with self._changed:
            until = None if self.wait_s is None else time.monotonic() + self.wait_s
            waited = False
            while self._held.get(task.id) is _PREPARING:
                if until is not None and time.monotonic() >= until:
                    raise PreparationWait(f"{task.origin or task.name}: preparing the task on another thread took "
                                          f"longer than {self.wait_s:.0f} s (its own code: does it sleep or loop "
                                          "forever?)")
                waited = True
                self._changed.wait(None if until is None else max(0.0, until - time.monotonic()))
            if task.id in self.broken or (waited and task.id not in self._held and task.id in self._failed):
                raise BrokenTask(self.broken.get(task.id) or self._failed[task.id])
            evaluator = self._held.get(task.id)
            if evaluator is not None:
                self._held.move_to_end(task.id)  # most recently used last
                return evaluator
            while len(self._held) >= self.keep:
                if not self._retire_one(busy, retired):
                    break
            self._held[task.id] = _PREPARING
            self._failed.pop(task.id, None)  # (what its waiters hear is this preparation's outcome)
        try:  # (from the mark on: whatever fails, the mark goes, or the task's every later job would wait)
            self._close(retired)
            if self.room is not None and not self.room.fits(task, self.task_ids()):
                with self._changed:
                    while self._retire_one(busy, retired):
                        pass
                self._close(retired)
            evaluator = self.make(task)
        except BaseException as exc:
            with self._changed:
                self._held.pop(task.id, None)
                if isinstance(exc, BrokenTask):
                    self._failed[task.id] = str(exc)
                self._changed.notify_all()
            raise
        with self._changed:
            self._held[task.id] = evaluator
            self._failed.pop(task.id, None)
            self._changed.notify_all()
        return evaluator

    def fits(self, task: Task) -> bool:
        """Whether `task` may be prepared now beside what is held (always, but on a GPU without room)."""
        with self._changed:
            held = task.id in self._held
        return held or self.room is None or self.room.fits(task, self.task_ids())

    def _retire_one(self, busy: set, retired: list) -> bool:
        """Move the least recently used evaluator that no busy task needs to `retired` (lock held)."""
        old_id = next((k for k, v in self._held.items() if k not in busy and v is not _PREPARING), None)
        if old_id is None:
            return False
        retired.append(self._held.pop(old_id))
        return True

    def _close(self, retired: list) -> None:
        if not retired:
            return
        with self.quiet_lock:
            failure = None
            for old in retired:
                try:
                    old.close()
                except Exception as exc:  # noqa: BLE001 - the others are closed all the same
                    failure = failure or exc
            retired.clear()
            gc.collect()  # reference modules and tensors can sit in reference cycles
            if self.room is not None:
                self.room.release_cached()
            if failure is not None:
                raise failure

    def retire_all(self) -> list[str]:
        """Close every held evaluator, busy or not (crowding.py: a verdict judged again alone); the
        ids of their tasks. None is being prepared: a worker calls this with its loads ahead dropped."""
        retired = []
        with self._changed:
            ids = [k for k, v in self._held.items() if v is not _PREPARING]
            retired = [self._held.pop(k) for k in ids]
        self._close(retired)
        return ids

    def task_ids(self) -> list[str]:
        with self._changed:
            return [k for k, v in self._held.items() if v is not _PREPARING]

    def close(self) -> None:
        with self._changed:
            held, self._held = [v for v in self._held.values() if v is not _PREPARING], collections.OrderedDict()
        self._close(held)  # each closed though one fails (their reference sides must all exit)


_PREPARING = object()  # Evaluators: a task whose evaluator a thread is preparing now


class EvalPool:
    """Interface of every backend."""

    workers: list[str]

    def submit(self, job: EvalJob) -> Future:
        raise NotImplementedError

    def run(self, jobs: Iterable[EvalJob], on_result: Callable[[EvalResult], None] | None = None) -> Iterator[EvalResult]:
        """Submit every job and yield results as they complete."""
        done: queue.Queue = queue.Queue()
        count = 0
        for job in jobs:
            future = self.submit(job)
            future.add_done_callback(done.put)
            count += 1
        for _ in range(count):
            result = done.get().result()
            if on_result:
                on_result(result)
            yield result

    def close(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        """Stop without waiting for candidates under way (an interrupt); by default the same as close()."""
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # An interrupted caller wants its prompt back, not the current candidates' verdicts.
        self.abort() if exc_type is not None and issubclass(exc_type, KeyboardInterrupt) else self.close()
        return False
