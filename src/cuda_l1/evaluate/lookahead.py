"""Candidates loaded ahead: a worker prepares its next jobs while it times the current one.

Only a timed window needs the device and the timed core to itself. Everything before a candidate's
first window (a side taken from the supply, its module imported, its model built, extensions it
asks for compiled, a new task's reference prepared) is work a worker can do beside the windows of
the candidate before it. With `depth` > 0 a worker holds that many queued jobs and loads each in a
helper thread (`Evaluator.preload`); its main thread then judges them one after another from where
their loads left them.

Nothing of this runs beside a timed window. A helper thread holds the supply's gate for every step
but its waits (side_supply.py), and every timed window holds the gate too; a side loading in the
background is stopped for each window like a warming spare, and the device is let settle before
the window starts. A loaded side stays stopped until its evaluation thaws it (and checks that it
did not run meanwhile). So a candidate cannot tell, and cannot use, that others are loaded beside
it: the windows see the same quiet host as without lookahead.

A preload never raises: whatever goes wrong (a task that cannot be prepared, a side that dies or
cannot be stopped) is kept and reported by the job's own evaluation, as without lookahead.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Iterable

from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.jobs import Evaluators
from cuda_l1.evaluate.sandbox import SideProcess


def lookahead_of(config: EvalConfig) -> int:
    """Jobs a worker loads ahead while it times another (lookahead.py): `config.lookahead`, by default
    2 on a GPU (measured on the H200 with forked sides: no stall, warm verdicts 1.5 s apart) and none
    on a CPU, where a loading side would take the timed core's only neighbour."""
    if config.lookahead is not None:
        return config.lookahead
    return 2 if config.device.startswith("cuda") else 0


@dataclasses.dataclass
class Preloaded:
    """A candidate's side started and loaded ahead (Evaluator.preload), stopped since: what its
    evaluation continues from."""

    source: str
    started: float  # time.monotonic() when the preload began: the evaluation's clock starts here
    proc: SideProcess | None = None
    loaded: tuple | None = None  # (Loaded, builds) when the side answered
    failure: BaseException | None = None  # ChildFailure (the candidate's) or an evaluator error
    start_side_s: float = 0.0
    load_s: float = 0.0

    def discard(self) -> None:
        if self.proc is not None:
            self.proc.close(graceful=False)
            self.proc = None


class Lookahead:
    """A worker's loads ahead, keyed by job id, on `depth` helper threads.

    The threads live as long as the worker: a side's parent-death signal fires when the thread that
    started it exits, and a helper thread starts sides (spares, a new task's reference, the
    candidate's own)."""

    def __init__(self, evaluators: Evaluators, depth: int):
        self.evaluators = evaluators
        self.depth = max(0, depth)
        self._threads = (ThreadPoolExecutor(max_workers=self.depth, thread_name_prefix="cuda-l1-load")
                         if self.depth else None)
        self._jobs: dict[Any, Future] = {}
        self._given_up: list[Future] = []  # loads `take` stopped waiting for, maybe still running
        self._lock = threading.Lock()

    def start(self, key, task, source: str, busy: Iterable[str]) -> None:
        """Begin loading `source` for `task` on a helper thread (once per key)."""
        if self._threads is None or key in self._jobs:
            return
        self._jobs[key] = self._threads.submit(self._load, task, source, frozenset(busy))

    def _load(self, task, source: str, busy: frozenset) -> tuple[Any, Any, BaseException | None]:
        try:
            if not self.evaluators.fits(task):  # no room on the device now: prepared in its own turn
                return None, None, None
            evaluator = self.evaluators.get(task, busy)
        except BaseException as exc:  # noqa: BLE001 - a task that cannot be prepared: the job's error
            return None, None, exc
        return evaluator, evaluator.preload(source), None  # preload never raises

    def take(self, key, timeout_s: float | None = None) -> tuple[Any, Any, BaseException | None]:
        """(evaluator, preloaded, error) for a job started here, once its load finished; (None, None,
        None) for a job never started, or whose load has not finished within `timeout_s` (the job is
        then judged without it; the side the load leaves is stopped when it ends)."""
        future = self._jobs.pop(key, None)
        if future is None:
            return None, None, None
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:  # judged without it; what the load leaves is stopped when it ends
            with self._lock:
                self._given_up.append(future)
            future.add_done_callback(lambda f: f.result()[1] is not None and f.result()[1].discard())
            return None, None, None

    def started(self) -> set:
        """Keys of the jobs loading or loaded here, not yet taken."""
        return set(self._jobs)

    def drop_all(self, timeout_s: float | None = None) -> int:
        """Wait for the loads under way (up to `timeout_s` each; one still loading then is stopped
        when it ends, as in `take`) and stop the sides they left; their jobs are judged without them,
        or loaded again later. How many there were, loads given up earlier and still running included."""
        keys = list(self._jobs)
        for key in keys:
            _, preloaded, _ = self.take(key, timeout_s)
            if preloaded is not None:
                preloaded.discard()
        with self._lock:
            self._given_up = [f for f in self._given_up if not f.done()]
            return len(keys) + len(self._given_up)

    def close(self) -> None:
        """Wait for the loads under way, stop the sides they left, end the threads."""
        self.drop_all()
        if self._threads is not None:
            self._threads.shutdown(wait=True)


def load_ahead(ahead, queued: list, depth: int, ready: set, busy: set) -> None:
    """Start loading the jobs of a worker's queue (job id, task, source, ...) after the first one
    (judged now), up to `depth`; at most one task not yet prepared at a time (the first job's
    included): a task's reference and input slots are what costs memory, and KernelBench's largest
    take a fifth of a GPU."""
    started = ahead.started()
    unprepared = {job[1].id for job in queued[:1] + [j for j in queued if j[0] in started]} - ready
    for job_id, task, source, *_ in queued[1 : 1 + depth]:
        if job_id in started:
            continue
        if task.id not in ready and task.id not in unprepared and unprepared:
            continue  # a second new task: later
        ahead.start(job_id, task, source, busy)
        if task.id not in ready:
            unprepared.add(task.id)
