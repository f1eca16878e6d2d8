"""The one path from a candidate to a stored verdict, for every caller: bench, audit, optimize and the
three training stages submit here.

    engine = Engine(store, pool, device_key="NVIDIA H200", config_key=config.config_key(), run_id=run)
    judged = engine.submit(task, candidate_id, code).result()   # a Judged: verdict, reused or not

A program (its exact source) is judged once per task, device and settings: a candidate whose settled
verdict is stored is not evaluated again, and one whose source is being evaluated right now waits for
that evaluation. Exact source, byte for byte (`tasks.code_id`), not a normalised form: a program can
read its own layout (line numbers, comments through linecache), and trailing whitespace or line-end
style can change what runs (a backslash followed by a space is a syntax error; string literals keep
their spaces), so two sources that differ only in layout may behave differently. Every new verdict is
stored as soon as the pool returns it, so a kill loses nothing already judged. Callers differ only in
how they wait (a thread, asyncio through `asyncio.wrap_future`, a progress bar over `as_completed`).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass

from cuda_l1.evaluate.jobs import EvalJob, EvalPool
from cuda_l1.evaluate.verdict import Verdict
from cuda_l1.store import Store
from cuda_l1.tasks import Task, code_id


UNSETTLED_TRIES = 3  # evaluations of one program that may fail as evaluations before the last failure stands


@dataclass
class Judged:
    """What became of one submitted candidate."""

    candidate_id: str
    verdict: Verdict
    reused: bool  # not evaluated for this submission: its verdict was known or under way
    stored: bool  # this submission stored a verdict row (for this candidate)
    judged: bool = True  # a worker judged it (not so where the pool closed or gave up first: nothing of the program)


class Engine:
    """Judges candidates through a pool and files every verdict in the store, each program once."""

    def __init__(self, store: Store, pool: EvalPool | None, *, device_key: str | None, config_key: str,
                 run_id: int | None, file_by_verdict_device: bool = False):
        self.store = store
        self.pool = pool
        # The device name verdicts are matched under (devices.device_key). None: the name the first verdict
        # carries (a caller that cannot name the GPUs ahead); until then nothing stored can be matched.
        self.device_key = device_key
        # File each verdict under the device it names rather than `device_key`, and look up under the
        # device the latest verdict names (the training stages, whose pool may be a Ray cluster that
        # names its GPUs only in its verdicts, or change between a run and its resume).
        self.file_by_verdict_device = file_by_verdict_device
        self.config_key = config_key
        self.run_id = run_id
        self.evaluations = 0  # programs sent to the pool by this engine
        self._lock = threading.Lock()  # guards _in_flight, evaluations, device_key; never held across calls out
        self._in_flight: dict[tuple[str, str], Future] = {}  # (task id, code_id) -> its (verdict, stored)

    def best_speedup(self, task_id: str) -> float | None:
        """The best verified speedup on this device under these settings (for the re-measure rule)."""
        if self.device_key is None:
            return None
        best = self.store.best_candidate(task_id, self.device_key, config_key=self.config_key)
        return best.speedup if best is not None else None

    def known(self, task: Task, candidate_id: str, code: str) -> Verdict | None:
        """A stored settled verdict (Verdict.settled) for this candidate (its exact source's id) on
        this device and settings; or its latest unsettled one once UNSETTLED_TRIES evaluations in a
        row failed as evaluations (an evaluation's own failure is retried, but a program that makes
        every evaluation of it fail, say by crashing the reference beside it, is not judged forever)."""
        if self.device_key is None:
            return None
        own = self.store.verdict_for(candidate_id, self.device_key, self.config_key, task_id=task.id)
        if own is not None and (own.settled or own.attempts >= UNSETTLED_TRIES):
            return own
        return None

    def submit(self, task: Task, candidate_id: str, code: str, *, best_known: float | None = None,
               thresholds: tuple[float, ...] = (), meta: dict | None = None) -> Future:
        """A future of the candidate's Judged (or of the error that prevented it). The candidate must be
        in the store already. `thresholds`: speedups the caller decides at (EvalJob.thresholds)."""
        out: Future = Future()
        key = (task.id, code_id(code))
        try:
            _check_candidate_id(candidate_id, key[1])
            with self._lock:
                running = self._in_flight.get(key)
            if running is None:
                known = self.known(task, candidate_id, code)
                if known is not None:
                    out.set_result(self._reuse(task, candidate_id, known))
                    return out
                with self._lock:  # another thread may have started the same program meanwhile
                    running = self._in_flight.get(key)
                    first = running is None
                    if first:
                        running = self._in_flight[key] = Future()
                        self.evaluations += 1
                if first:
                    self._start(key, task, candidate_id, code, best_known, thresholds, meta, running)
            else:
                first = False
        except BaseException as exc:  # noqa: BLE001 - the store or the pool failed: the waiter hears it
            out.set_exception(exc)
            return out
        running.add_done_callback(lambda done: self._settle(done, out, task, candidate_id, first))
        return out

    def _start(self, key, task: Task, candidate_id: str, code: str, best_known, thresholds, meta,
               running: Future) -> None:
        job = EvalJob(task, code, key=candidate_id, best_known_speedup=best_known, thresholds=tuple(thresholds),
                      meta=dict(meta or {}))
        try:
            pool_future = self.pool.submit(job)
        except BaseException as exc:  # noqa: BLE001 - no evaluation under way: free the program
            with self._lock:
                self._in_flight.pop(key, None)
            running.set_exception(exc)
            return
        pool_future.add_done_callback(lambda f: self._finish(key, task, candidate_id, f, running))

    def _finish(self, key, task: Task, candidate_id: str, pool_future: Future, running: Future) -> None:
        """The pool's answer: store it (unless no worker judged it), then release everyone waiting."""
        try:
            result = pool_future.result()
            verdict, stored = result.verdict, False
            if result.judged:  # a pool that closed first says nothing of the candidate: nothing is stored
                with self._lock:
                    if self.device_key is None or (self.file_by_verdict_device and verdict.device):
                        # (filed by the verdict's device: the device judging now is the one looked up)
                        self.device_key = verdict.device or self.device_key
                    device = self.device_key or verdict.device
                if self.file_by_verdict_device or not device:
                    device = verdict.device or "unknown"
                stored = self.store.record_verdict(candidate_id, verdict, self.run_id, device, self.config_key,
                                                   task_id=task.id)
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter
            with self._lock:
                self._in_flight.pop(key, None)
            running.set_exception(exc)
            return
        with self._lock:
            self._in_flight.pop(key, None)
        running.set_result((verdict, stored, result.judged))

    def _settle(self, done: Future, out: Future, task: Task, candidate_id: str, first: bool) -> None:
        if out.cancelled():  # the caller gave up waiting
            return
        if done.exception() is not None:
            out.set_exception(done.exception())
            return
        verdict, stored, by_worker = done.result()
        try:
            judged = (Judged(candidate_id, verdict, reused=False, stored=stored) if first
                      else self._reuse(task, candidate_id, verdict))
            judged.judged = by_worker
        except BaseException as exc:  # noqa: BLE001 - a store error reaches the waiter, not a log
            out.set_exception(exc)
            return
        out.set_result(judged)

    def _reuse(self, task: Task, candidate_id: str, verdict: Verdict) -> Judged:
        """The same source judged before or meanwhile: its candidate row already holds the verdict."""
        return Judged(candidate_id, verdict, reused=True, stored=False)


def _check_candidate_id(candidate_id: str, exact_id: str) -> None:
    """The stored verdict is looked up by the caller's id and the running one by the code's: they must
    be one id, or a program could be handed the verdict of a different text."""
    if candidate_id != exact_id:
        raise ValueError(f"candidate id {candidate_id} is not the id of the code submitted with it ({exact_id}); "
                         "pass the id store.add_candidate returned for this code")
