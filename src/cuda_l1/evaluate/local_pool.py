"""The local backend of the evaluation pool: one worker process per device slot on this host.

    with LocalPool(device="cuda") as pool:                   # one worker per visible GPU
        for result in pool.run(jobs):                         # as they complete
            store.record_verdict(...)                         # the caller is the one store owner

A worker (local_worker.py) is a trusted process: it prepares references and judges candidates, each
of which runs in its own sandboxed child, and answers on a channel no other worker writes
(worker_results.py): one dying mid-message cannot hold up the others' verdicts. It keeps the
references of the last two tasks it judged (`jobs.Evaluators`), so a long run's memory stays bounded.
A worker that dies is replaced and its candidate retried once; a second death becomes a runtime_error
verdict. A worker dies with the process that owns the pool, even one killed with SIGKILL (lifeline.py).

The pool also compiles queued candidates' extensions ahead on the CPU cores (build/ahead.py) and
dispatches only candidates whose builds are done, and it has a suspicious speedup (the re-measure
rule) confirmed by a different worker, so on a multi-GPU host by a different GPU.

It is a module of its own so that the Ray backend (ray_pool.py) and the factory choosing between the
two (pool.py) stay apart: this one depends on the shared contract (jobs.py) only.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import sys
import threading
import time
from concurrent.futures import Future

from cuda_l1.errors import BrokenTask, RunError
from cuda_l1.evaluate import pinning
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.jobs import NO_WORKER, TASK_ERROR, EvalJob, EvalPool, EvalResult, deliver, failed_verdict
from cuda_l1.evaluate.local_worker import STARTED, worker_main
from cuda_l1.evaluate.task_marks import PreparingMarks
from cuda_l1.evaluate.verdict import Verdict
from cuda_l1.evaluate.worker_results import WorkerResults, wait_any
from cuda_l1.evaluate.worker_slots import exit_text, visible_gpus, worker_devices  # noqa: F401 (visible_gpus: pool.py)


class LocalPool(EvalPool):
    """One worker process per device slot on this host."""

    def __init__(self, device: str = "cuda", config: EvalConfig | None = None, workers: int | None = None,
                 max_attempts: int = 2, prebuild: bool | None = None, prebuilder=None,
                 remeasure_elsewhere: bool = True):
        self.config = config or EvalConfig()
        self.workers = worker_devices(device, workers)
        self.max_attempts = max_attempts
        # With several workers, a suspicious speedup is re-measured by another worker (another GPU
        # when there is one) instead of by a fresh process on the same device.
        self.remeasure_elsewhere = bool(remeasure_elsewhere and self.config.remeasure and len(self.workers) > 1)
        self._worker_config = (dataclasses.replace(self.config, remeasure=False) if self.remeasure_elsewhere
                               else self.config)
        self._first: dict[int, tuple[Verdict, int]] = {}  # job id -> (verdict to confirm, worker index)
        # Extensions are compiled ahead on the CPU cores by default on GPUs; on a CPU device the
        # compilers would compete with the timed calls for the same cores.
        if prebuild is None:
            prebuild = not self.workers[0].startswith("cpu")
        if prebuilder is None and prebuild:
            from cuda_l1.evaluate.build.ahead import Prebuilder

            prebuilder = Prebuilder(self.config)
        self.prebuilder = prebuilder
        self._builds: dict[int, list[Future]] = {}  # job id -> builds it waits for before dispatch
        self._ctx = mp.get_context("spawn")  # workers must not inherit a CUDA context
        self._slots: list = []
        self._pending: list[int] = []  # job ids in submission order (retries go first)
        self._futures: dict[int, tuple[Future, EvalJob, int]] = {}
        # Jobs sent to each worker, oldest first: the one it judges and those it loads ahead.
        self._inflight: dict[int, list[int]] = {i: [] for i in range(len(self.workers))}
        self._judging: dict[int, int | None] = {i: None for i in range(len(self.workers))}  # its STARTED job
        self._task_deaths: dict[str, int] = {}  # task id -> workers that died running its own code
        from cuda_l1.evaluate.lookahead import lookahead_of

        self._capacity = 1 + lookahead_of(dataclasses.replace(self.config, device=self.workers[0]))
        self._next_id = 0
        self._lock = threading.Lock()
        self._closing = False  # no more dispatching or replacing; workers are being stopped
        self._stopped = False  # the dispatcher may exit
        self._closed = False
        self._aborting = False  # abort(): workers are not waited for
        # The dispatcher thread starts every worker (and every replacement) and outlives them all:
        # on Linux a worker's parent-death signal fires when the thread that started it exits.
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._failure = ""  # why the dispatcher failed (_fail_all): what later jobs are told
        self._dispatcher = threading.Thread(target=self._dispatch, name="cuda-l1-pool", daemon=True)
        self._dispatcher.start()
        self._started.wait()
        if self._start_error is not None:
            self._stopped = True
            raise self._start_error

    def _start(self, index: int):
        inbox = self._ctx.Queue()
        config = self._worker_config
        if self.workers[index] == "cpu" and config.cpu_core is None and hasattr(os, "sched_getaffinity"):
            cores = sorted(os.sched_getaffinity(0))  # CPU workers time on different cores
            timed = {cores[i % len(cores)] for i, kind in enumerate(self.workers) if kind == "cpu"}
            mine = cores[index % len(cores)]  # the parent waits for rings off the others' (gating.wait_cores)
            config = dataclasses.replace(config, cpu_core=mine, busy_cores=tuple(sorted(timed - {mine})))
        elif self.workers[index] != "cpu" and config.timed_core is None and hasattr(os, "sched_getaffinity"):
            timed, busy = pinning.gpu_worker_cores(self.workers, index, sorted(os.sched_getaffinity(0)))
            config = dataclasses.replace(config, timed_core=timed, busy_cores=busy)
        marks, results = PreparingMarks(self._ctx), WorkerResults(self._ctx)
        proc = self._ctx.Process(target=worker_main,
                                 args=(self.workers[index], config, inbox, results.writer, os.getpid(), marks),
                                 name=f"cuda-l1-worker-{index}", daemon=True)
        try:
            proc.start()
        finally:
            results.started()  # (its pipe goes with a start that failed)
        return proc, inbox, marks, results

    def _start_again(self, index: int):
        """A replacement for a dead worker; a start that fails (no process to be had for a moment) is
        tried again for about 15 s before the dispatcher gives up (_fail_all)."""
        for pause in (0.5, 1, 2, 4, 8, 0):
            try:
                return self._start(index)
            except Exception as exc:  # noqa: BLE001
                if not pause:
                    raise
                print(f"cuda-l1: evaluation worker {index} could not be started ({type(exc).__name__}: {exc}); "
                      f"trying again in {pause} s", file=sys.stderr, flush=True)
                time.sleep(pause)

    def submit(self, job: EvalJob) -> Future:
        future: Future = Future()
        with self._lock:  # (closing is set under it: a job is either refused or seen by whoever closes)
            closing = self._closing
            if not closing:
                job_id = self._next_id
                self._next_id += 1
                self._futures[job_id] = (future, job, 1)
        if closing:  # (after a failure, as an error: a run must stop, not score its candidates as failures)
            deliver(future, _closed(job), RunError(self._failure) if self._failure else None)
            return future
        builds = self.prebuilder.submit(job.source) if self.prebuilder is not None else []
        with self._lock:
            if builds:
                self._builds[job_id] = builds
            self._pending.append(job_id)
        return future

    def _next_ready(self, index: int) -> int | None:
        """The oldest pending job that worker `index` may take and whose extensions are built: a
        worker never waits on a compiler while another job is ready. With none ready, workers stay
        idle until a build finishes. A re-measurement never goes to the worker that measured first."""
        with self._lock:
            cancelled = [j for j in self._pending if j in self._futures and self._futures[j][0].cancelled()]
            for job_id in cancelled:  # (its caller gave up on it: never judged, nothing to answer)
                self._pending.remove(job_id)
                self._futures.pop(job_id)
                self._builds.pop(job_id, None)
                self._first.pop(job_id, None)
            for position, job_id in enumerate(self._pending):
                first = self._first.get(job_id)
                if first is not None and first[1] == index:
                    continue
                if all(f.done() for f in self._builds.get(job_id, ())):
                    self._builds.pop(job_id, None)
                    return self._pending.pop(position)
        return None

    def _assign(self) -> None:
        """Fill each worker up to its capacity: the job it judges and those it loads ahead (workers
        are filled one after another, so a task's candidates tend to stay with one worker)."""
        for index, sent in self._inflight.items():
            while len(sent) < self._capacity and not self._closing:
                job_id = self._next_ready(index)
                if job_id is None:
                    break
                _, job, _ = self._futures[job_id]
                sent.append(job_id)
                self._slots[index][1].put((job_id, job.task, job.source, job.best_known_speedup, job.thresholds))

    def _resolve(self, job_id: int, verdict: Verdict, worker: str) -> None:
        with self._lock:
            future, job, attempts = self._futures.pop(job_id)
        deliver(future, EvalResult(job, verdict, worker, attempts))

    def _dispatch(self) -> None:
        try:
            for index in range(len(self.workers)):
                self._slots.append(self._start(index))
        except BaseException as exc:  # reported by the constructor
            self._start_error = exc
        finally:
            self._started.set()
        while not self._stopped and self._start_error is None:
            try:
                self._assign()
                wait_any([results for *_, results in self._slots], timeout=0.2)
                for index in range(len(self._slots)):
                    self._receive(index)
                self._replace_dead()
            except BaseException as exc:  # noqa: BLE001 - a dead dispatcher would leave every caller waiting
                self._fail_all(f"the pool's dispatcher failed ({type(exc).__name__}: {exc}); no job can be judged")
                return

    def _fail_all(self, reason: str) -> None:
        """Every job not yet resolved, and every later one, fails with a RunError saying why: no
        verdict, since none was reached, and a trainer must not take it for the candidate's failure
        (its workers end with this thread: their parent-death signal)."""
        with self._lock:
            self._closing, self._failure = True, reason
            jobs, self._pending = list(self._futures.items()), []
            self._futures.clear()
        for _, (future, _job, _attempts) in jobs:
            deliver(future, error=RunError(reason))

    def _receive(self, index: int) -> None:
        """Take in what worker `index` said: that it started a job, or a job's outcome."""
        proc, _, _, results = self._slots[index]
        messages = results.receive()
        if results.corrupted and proc.is_alive():  # its channel cannot be read on: replaced, as if dead
            proc.kill()
            proc.join(timeout=5)
        for message in messages:
            try:
                job_id, verdict_dict, error = message
                hash(job_id)
            except Exception:  # noqa: BLE001 - not a message the worker's code sends (only a task's could)
                results.corrupted = results.ended = True  # nothing more is read from it
                if proc.is_alive():  # replaced as if dead: the jobs it still holds are sent again
                    proc.kill()
                    proc.join(timeout=5)
                return
            try:
                self._take(index, job_id, verdict_dict, error)
            except Exception as exc:  # noqa: BLE001 - this job fails, not the pool (nor does it wait for ever)
                self._fail_job(job_id, f"the pool could not take in this job's outcome ({type(exc).__name__}: {exc})",
                               self.workers[index])

    def _fail_job(self, job_id, reason: str, worker: str) -> None:
        """Job `job_id`, if still unanswered, gets a failed verdict saying why."""
        with self._lock:
            entry = self._futures.pop(job_id, None)
            self._first.pop(job_id, None)
        if entry is not None:
            future, job, attempts = entry
            deliver(future, EvalResult(job, failed_verdict(job, reason), worker, attempts))

    def _take(self, index: int, job_id, verdict_dict, error) -> None:
        """One message of worker `index`: a job started, or its outcome."""
        try:
            verdict = Verdict.from_dict(verdict_dict) if isinstance(verdict_dict, dict) else None
        except Exception as exc:  # noqa: BLE001 - the job gets a failed verdict, not an endless wait
            verdict, error = None, f"the worker's verdict could not be read ({type(exc).__name__}: {exc})"
        if job_id not in self._inflight[index]:
            return  # (not possible: a worker answers only the jobs it was sent)
        if verdict_dict == STARTED:
            self._judging[index] = job_id
            return
        self._inflight[index].remove(job_id)
        if self._judging[index] == job_id:
            self._judging[index] = None
        if verdict_dict == TASK_ERROR and job_id not in self._first:
            with self._lock:
                future = self._futures.pop(job_id, (None,))[0]
            if future is not None:
                deliver(future, error=BrokenTask(str(error or "the task's reference does not run")))
        elif job_id in self._futures:  # (a re-measure that met a broken task: a failed measurement)
            _, job, _ = self._futures[job_id]
            verdict = verdict or failed_verdict(job, str(error or ""))
            self._settle(job_id, job, verdict, index, self.workers[index])

    def _settle(self, job_id: int, job: EvalJob, verdict: Verdict, index: int | None, worker: str) -> None:
        """Resolve the job, or first send a suspicious speedup to another worker to be re-measured."""
        from cuda_l1.evaluate.evaluator import merge_remeasure, needs_remeasure

        first = self._first.pop(job_id, None)
        if first is not None:
            first_verdict, first_index = first
            kind = "another GPU" if worker != self.workers[first_index] else "another worker process"
            where = f"{kind}: worker {index} ({worker}) after worker {first_index} ({self.workers[first_index]})"
            self._resolve(job_id, merge_remeasure(first_verdict, verdict, where), self.workers[first_index])
        elif (self.remeasure_elsewhere and index is not None
              and needs_remeasure(verdict, self.config, job.best_known_speedup)):
            with self._lock:
                self._first[job_id] = (verdict, index)
                self._pending.insert(0, job_id)
        else:
            self._resolve(job_id, verdict, worker)

    def _replace_dead(self) -> None:
        for index, (proc, inbox, marks, results) in enumerate(self._slots):
            if proc.is_alive() or self._closing:
                continue
            self._receive(index)  # what it said before it died (its pipe keeps it)
            if self._closing:  # (a result's callback closed the pool)
                return
            results.close()
            inbox.cancel_join_thread()  # jobs it never read must not hold this process's exit
            inbox.close()
            sent, judging = self._inflight[index], self._judging[index]
            ended = exit_text(proc.exitcode)
            print(f"cuda-l1: evaluation worker {index} ({self.workers[index]}) {ended} while it held "
                  f"{len(sent)} job(s); starting another", file=sys.stderr, flush=True)
            self._slots[index] = self._start_again(index)
            self._inflight[index], self._judging[index] = [], None
            if self._task_killed(marks.read(), sent, ended):
                continue
            # The job it was judging counts an attempt (the oldest it held, if it died before saying
            # which); the jobs it only held or loaded ahead go back first, their attempts uncounted.
            job_id = judging if judging is not None else (sent[0] if sent else None)
            with self._lock:
                self._pending[:0] = [j for j in sent if j != job_id and j in self._futures]
            if job_id is None or job_id not in self._futures:
                continue
            future, job, attempts = self._futures[job_id]
            if attempts < self.max_attempts:
                self._futures[job_id] = (future, job, attempts + 1)
                with self._lock:
                    self._pending.insert(0, job_id)
            else:
                self._first.pop(job_id, None)
                self._resolve(job_id, failed_verdict(job, f"the evaluation worker died {attempts} times on this "
                                                        f"candidate (the last {ended})",
                                                        evaluation_failed=False),
                              self.workers[index])

    def _task_killed(self, preparing: list[str], sent: list[int], ended: str) -> bool:
        """A worker that died while running a task's own code (task_marks.py): its jobs go back
        uncounted, and a task that did it `max_attempts` times fails every job of it as BrokenTask."""
        if len(preparing) != 1:  # none, or two at once (helper threads): whose it was is not known
            return False
        task_id = preparing[0]
        self._task_deaths[task_id] = self._task_deaths.get(task_id, 0) + 1
        broken = self._task_deaths[task_id] >= self.max_attempts
        with self._lock:
            self._pending[:0] = [j for j in sent if j in self._futures]
            doomed = [j for j in self._pending
                      if broken and j in self._futures and self._futures[j][1].task.id == task_id]
            self._pending = [j for j in self._pending if j not in doomed]
            for job_id in doomed:
                self._first.pop(job_id, None)
            doomed = [self._futures.pop(job_id)[:2] for job_id in doomed]  # (future, job)
        for future, job in doomed:
            deliver(future, error=BrokenTask(
                f"{job.task.origin or job.task.name}: the evaluation worker {ended} while running the task's "
                f"own code (its import or its reference's first run), {self.max_attempts} times: a task must "
                "not end or crash the process (os._exit, a fatal signal, more memory than the host has)"))
        return True

    def worker_pids(self) -> list[int]:
        return [proc.pid for proc, *_ in self._slots]

    def abort(self) -> None:
        """Stop now (the caller was interrupted): the workers are killed mid-candidate (their sides go
        with them, lifeline.py) instead of finishing it; verdicts already given are kept by the caller."""
        self._aborting = True
        self.close()

    def close(self) -> None:
        """Stop the workers (each finishes its candidate, for at most 10 s; none after abort()), then
        the dispatcher; jobs still unanswered get a runtime_error verdict."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._closing = True
        if self.prebuilder is not None:
            self.prebuilder.close(cancel=self._aborting)
        for proc, inbox, *_ in self._slots:
            try:
                inbox.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + (0 if self._aborting else 10)
        for proc, *_ in self._slots:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        self._stopped = True  # only now: the workers' parent-death signal is tied to this thread
        if threading.current_thread() is not self._dispatcher:  # close() from a result callback
            self._dispatcher.join(timeout=5)
        for *_, results in self._slots:
            results.close()
        with self._lock:
            unanswered = list(self._futures.values())
            self._futures.clear()
        for future, job, _ in unanswered:  # outside the lock: a result's callbacks may take other locks
            deliver(future, _closed(job))


def _closed(job: EvalJob) -> EvalResult:
    """What a job gets that the pool was closed before judging."""
    return EvalResult(job, failed_verdict(job, "the pool was closed"), NO_WORKER)

