"""The Ray backend of the evaluation pool: the same interface as LocalPool, across any number of hosts.

    with make_pool("ray://head:10001", device="cuda") as pool:   # one actor per GPU of the cluster
        for result in pool.run(jobs):
            store.record_verdict(...)                             # the driver stays the one store owner

Each actor is a trusted worker like `local_worker.worker_main`: it keeps the evaluators (prepared
references) of the last tasks it judged (`jobs.Evaluators`) and judges candidates, each in its own
sandboxed child on the actor's node. Verdicts travel as plain dicts. An actor that dies (process
killed, node lost) is replaced and its candidate retried once; a second death becomes a runtime_error
verdict, exactly as in LocalPool. Actors die with the driver: Ray ends a job's actors when its driver
exits, however it exits (and a Ray instance the pool started itself goes down with the driver's
process).

Which cluster to join, or whether to start one, is ray_cluster.py's part. Of the pool modules this
one imports the shared contract (jobs.py) only, never the local backend or the factory (pool.py).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import socket
import threading
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import exceptions as ray_errors

from cuda_l1.errors import BrokenTask, UserError
from cuda_l1.evaluate import crowding
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.device_room import room_for
from cuda_l1.evaluate.jobs import (NO_WORKER, TASK_ERROR, EvalJob, EvalPool, EvalResult, Evaluators, deliver,
                                   failed_verdict)
from cuda_l1.evaluate.ray_cluster import connect, runtime_env_secrets
from cuda_l1.evaluate.verdict import Verdict

# An actor that fails to come up this many times in a row is given up (its slot is dropped).
_START_FAILURES = 3
# How long dispatching blocks in ray.wait before it looks at new submissions again.
_POLL_S = 0.2


class EvalWorker:
    """Body of one Ray actor: a trusted evaluation worker on whatever node Ray placed it."""

    def __init__(self, device: str, config: EvalConfig):
        # Ray pins the actor's GPU through CUDA_VISIBLE_DEVICES, so "cuda" here is that one GPU.
        self.device = "cuda" if device.startswith("cuda") else "cpu"
        self.config = dataclasses.replace(config, device=self.device)
        self.evaluators = Evaluators(self._make, room=room_for(self.device, config.task_timeout_s))
        self.supply = None  # fresh sides shared by this actor's evaluators (side_supply.py)
        from cuda_l1.evaluate.probe import probe_ahead

        probe_ahead(self.config.sandbox, self.device)  # CUDA: confinement probed while the first task loads

    def _make(self, task):
        from cuda_l1.evaluate.evaluator import Evaluator, prewarm_of
        from cuda_l1.evaluate.side_supply import SideSupply

        if self.supply is None:
            self.supply = SideSupply(prewarm_of(self.config), spares=self.config.spares)
        return Evaluator(task, self.config, supply=self.supply)

    def info(self) -> dict:
        import torch

        import cuda_l1
        import cuda_l1.evaluate.evaluator  # noqa: F401  (imported now, not on the first candidate)

        gpu_ids = [str(g) for g in ray.get_gpu_ids()] if self.device == "cuda" else []
        where = f"cuda:{gpu_ids[0]}" if gpu_ids else self.device
        return {"host": socket.gethostname(), "pid": os.getpid(), "gpu_ids": gpu_ids,
                "label": f"{where}@{socket.gethostname()}", "cuda_l1": cuda_l1.__version__,
                "torch": torch.__version__}

    def evaluate(self, task, source: str, best: float | None,
                 thresholds: tuple[float, ...] = ()) -> tuple[dict | None, str | None]:
        try:
            evaluator = crowding.prepare(self.evaluators, None, task, ())  # a failure beside others: again, alone
            evaluator.config.best_known_speedup = best
            return crowding.judge(evaluator, source, device=evaluator.config.device, evaluators=self.evaluators,
                                  task=task, thresholds=thresholds).to_dict(), None
        except BrokenTask as exc:  # the task's reference failed in this process: the caller's bad input
            return TASK_ERROR, str(exc)
        except Exception as exc:  # the evaluation failed: a runtime_error verdict, judged again later
            return None, f"{type(exc).__name__}: {exc}"

    def prepared_tasks(self) -> list[str]:
        """Ids of the tasks whose reference this actor holds now (introspection for tests)."""
        return sorted(self.evaluators.task_ids())


@dataclass
class _Slot:
    """One worker position of the pool and the actor currently filling it."""

    actor: Any = None
    ready: Any = None  # ObjectRef of info() while the actor starts; None once it is up
    started: float = 0.0  # when the current actor was asked for
    info: dict = field(default_factory=dict)
    job_id: int | None = None  # the job in flight on this actor
    ref: Any = None  # ObjectRef of that job's evaluate()
    start_failures: int = 0
    dropped: str = ""  # why this slot was given up ("" while it is in use)


class RayPool(EvalPool):
    """One actor per GPU of a Ray cluster (device cuda) or `workers` CPU actors (device cpu)."""

    def __init__(self, device: str = "cuda", config: EvalConfig | None = None, workers: int | None = None,
                 address: str | None = None, max_attempts: int = 2, cpus_per_worker: float = 1.0,
                 start_timeout_s: float = 600.0):
        self.config = config or EvalConfig()
        self.max_attempts = max_attempts
        self.start_timeout_s = start_timeout_s
        self._owns_ray = False
        if not ray.is_initialized():
            connect(device, workers, address, cpus_per_worker)
            self._owns_ray = True
        try:
            self.device, count = self._plan(device, workers)
        except Exception:
            self._shutdown_own()
            raise
        options: dict[str, Any] = {"num_cpus": cpus_per_worker, "max_restarts": 0, "max_task_retries": 0,
                                   "scheduling_strategy": "SPREAD"}
        if self.device == "cuda":
            options["num_gpus"] = 1
        # No runtime_env of our own: an actor gets its node's environment (that of `ray start`) plus the
        # job's runtime_env, and nothing else from the driver.
        self.runtime_env_secrets = runtime_env_secrets()
        if self.runtime_env_secrets:
            warnings.warn("the Ray job's runtime_env passes credential-like variables to every evaluation "
                          f"worker: {', '.join(self.runtime_env_secrets)}; candidates do not see them, but "
                          "the workers do not need them either", stacklevel=2)
        self._actor_class = ray.remote(**options)(EvalWorker)
        self.workers = [self.device] * count
        self._slots = [_Slot() for _ in range(count)]
        self._pending: collections.deque[int] = collections.deque()
        self._futures: dict[int, tuple[Future, EvalJob, int]] = {}
        self._next_id = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._closed = False
        self._unusable = ""  # set when no job can be answered any more (every slot dropped, dispatcher broke)
        for index in range(count):
            self._start(index)
        self._dispatcher = threading.Thread(target=self._dispatch, name="cuda-l1-ray-pool", daemon=True)
        self._dispatcher.start()

    # -- cluster -----------------------------------------------------------------------------------
    def _plan(self, device: str, workers: int | None) -> tuple[str, int]:
        """The actors' device kind and how many: one per cluster GPU for cuda, `workers` for cpu."""
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if device == "auto":
            device = "cuda" if gpus else "cpu"
        if device.startswith("cuda"):
            if not gpus:
                raise UserError(f"--device {device} was asked for, but the Ray cluster has no GPUs "
                                "(start its nodes with GPUs visible, or use --device cpu).")
            # 'cuda:N' names a GPU of one host, which means nothing across a cluster: one actor, any GPU.
            count = 1 if ":" in device else (gpus if workers is None else max(1, min(workers, gpus)))
            return "cuda", count
        return "cpu", max(1, workers or 1)

    def _shutdown_own(self) -> None:
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        self._owns_ray = False

    # -- actors ------------------------------------------------------------------------------------
    def _start(self, index: int) -> None:
        slot = self._slots[index]
        slot.actor = self._actor_class.remote(self.device, self.config)
        slot.ready = slot.actor.info.remote()
        slot.started = time.monotonic()
        slot.info = {}
        slot.job_id, slot.ref = None, None

    def _kill(self, slot: _Slot) -> None:
        if slot.actor is not None:
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:  # already gone with its node
                pass
        slot.actor = None

    def _drop(self, index: int, reason: str) -> None:
        slot = self._slots[index]
        self._kill(slot)
        slot.ready, slot.dropped = None, reason
        if all(s.dropped for s in self._slots):
            self._give_up(f"no evaluation worker could be started on the Ray cluster: {reason}")

    def worker_pids(self) -> list[int]:
        """Process ids of the actors that are up (on their own hosts)."""
        return [s.info["pid"] for s in self._slots if s.info and not s.dropped]

    def worker_info(self) -> list[dict]:
        """What each running actor reported at start: host, pid, GPU ids, versions."""
        return [dict(s.info) for s in self._slots if s.info and not s.dropped]

    def prepared_tasks(self) -> dict[str, list[str]]:
        """Task ids with a prepared reference, per running actor (by label and pid); waits for the
        candidates in flight, since an actor answers one call at a time."""
        live = [s for s in self._slots if s.info and not s.dropped and s.actor is not None]
        refs = [s.actor.prepared_tasks.remote() for s in live]
        return {f"{s.info['label']}#{s.info['pid']}": ids for s, ids in zip(live, ray.get(refs))}

    # -- jobs --------------------------------------------------------------------------------------
    def submit(self, job: EvalJob) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closing or self._unusable:
                reason = self._unusable or "the pool was closed"
                deliver(future, EvalResult(job, failed_verdict(job, reason), NO_WORKER))
                return future
            job_id = self._next_id
            self._next_id += 1
            self._futures[job_id] = (future, job, 1)
            self._pending.append(job_id)
        self._wake.set()
        return future

    def _resolve(self, job_id: int, verdict: Verdict, worker: str) -> None:
        with self._lock:
            entry = self._futures.pop(job_id, None)
        if entry is not None:
            future, job, attempts = entry
            deliver(future, EvalResult(job, verdict, worker, attempts))

    def _give_up(self, message: str) -> None:
        with self._lock:
            self._unusable = message
        self._fail_all(message)

    def _fail_all(self, message: str) -> None:
        with self._lock:
            entries = list(self._futures.values())
            self._futures.clear()
            self._pending.clear()
        for future, job, attempts in entries:
            deliver(future, EvalResult(job, failed_verdict(job, message), NO_WORKER, attempts))

    def _assign(self) -> None:
        for slot in self._slots:
            if slot.dropped or slot.ready is not None or slot.job_id is not None:
                continue
            with self._lock:
                while self._pending and self._futures[self._pending[0]][0].cancelled():
                    self._futures.pop(self._pending.popleft())  # (its caller gave up on it: never judged)
                if not self._pending:
                    return
                job_id = self._pending.popleft()
                _, job, _ = self._futures[job_id]
            slot.job_id = job_id
            slot.ref = slot.actor.evaluate.remote(job.task, job.source, job.best_known_speedup, job.thresholds)

    def _dispatch(self) -> None:
        try:
            self._dispatch_loop()
        except Exception as exc:  # answer every job rather than leave callers waiting forever
            if not self._closing:
                self._give_up(f"the Ray pool stopped dispatching: {_short(exc)}")

    def _dispatch_loop(self) -> None:
        while not self._closing and not self._unusable:
            self._assign()
            waiting: dict[Any, tuple[int, bool]] = {}  # ref -> (slot index, whether it is a start-up ref)
            for index, slot in enumerate(self._slots):
                if slot.ready is not None:
                    waiting[slot.ready] = (index, True)
                elif slot.ref is not None:
                    waiting[slot.ref] = (index, False)
            if not waiting:
                self._wake.wait(_POLL_S)
                self._wake.clear()
                continue
            done, _ = ray.wait(list(waiting), num_returns=1, timeout=_POLL_S)
            for ref in done:
                index, starting = waiting[ref]
                if starting:
                    self._started(index)
                else:
                    self._finished(index)
            self._check_start_deadlines()

    def _started(self, index: int) -> None:
        slot = self._slots[index]
        try:
            slot.info = ray.get(slot.ready)
        except ray_errors.RayError as exc:
            slot.start_failures += 1
            self._kill(slot)
            if slot.start_failures >= _START_FAILURES:
                self._drop(index, f"the worker failed to start {slot.start_failures} times: {_short(exc)}")
            else:
                self._start(index)
            return
        slot.ready, slot.start_failures = None, 0
        self.workers[index] = slot.info.get("label", self.device)
        import cuda_l1

        if slot.info.get("cuda_l1") != cuda_l1.__version__:
            warnings.warn(f"the worker on {slot.info.get('host')} runs cuda_l1 {slot.info.get('cuda_l1')}, this "
                          f"driver {cuda_l1.__version__}: install the same version on every node")

    def _finished(self, index: int) -> None:
        slot = self._slots[index]
        job_id, ref = slot.job_id, slot.ref
        slot.job_id, slot.ref = None, None
        label = self.workers[index]
        try:
            verdict_dict, error = ray.get(ref)
        except ray_errors.RayTaskError as exc:  # the call itself failed (arguments that do not unpickle)
            verdict_dict, error = None, _short(exc)
        except ray_errors.RayError as exc:  # the actor died: its process was killed or its node was lost
            self._replace(index, job_id, exc)
            return
        with self._lock:
            entry = self._futures.get(job_id)
        if entry is None:
            return
        if verdict_dict == TASK_ERROR:
            with self._lock:
                self._futures.pop(job_id, None)
            deliver(entry[0], error=BrokenTask(error or "the task's reference does not run"))
            return
        try:
            verdict = Verdict.from_dict(verdict_dict) if verdict_dict else failed_verdict(entry[1], error or "")
        except Exception as exc:  # noqa: BLE001 - this job fails, not the pool
            verdict = failed_verdict(entry[1], f"the worker's verdict could not be read ({type(exc).__name__}: {exc})")
        self._resolve(job_id, verdict, label)

    def _replace(self, index: int, job_id: int | None, cause: Exception) -> None:
        slot = self._slots[index]
        label = self.workers[index]
        self._kill(slot)
        self._start(index)
        with self._lock:
            entry = self._futures.get(job_id) if job_id is not None else None
            if entry is not None and entry[2] < self.max_attempts:
                self._futures[job_id] = (entry[0], entry[1], entry[2] + 1)
                self._pending.appendleft(job_id)  # retried before anything new
                return
        if entry is not None:
            message = f"the evaluation worker died {entry[2]} times on this candidate (last: {_short(cause)})"
            self._resolve(job_id, failed_verdict(entry[1], message, evaluation_failed=False), label)

    def _check_start_deadlines(self) -> None:
        now = time.monotonic()
        for index, slot in enumerate(self._slots):
            if slot.ready is not None and not slot.dropped and now - slot.started > self.start_timeout_s:
                self._drop(index, f"no {self.device} worker could be placed within {self.start_timeout_s:.0f} s "
                                  "(does the cluster have the GPUs/CPUs it asked for?)")

    # -- shutdown ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Answer every unfinished job, kill the actors, stop a Ray instance this pool started."""
        if self._closed:
            return
        with self._lock:
            self._closing = True
        self._wake.set()
        if threading.current_thread() is not self._dispatcher:  # close() from a result callback
            self._dispatcher.join(timeout=10)
        for slot in self._slots:
            self._kill(slot)
        self._fail_all("the pool was closed")
        self._closed = True
        self._shutdown_own()


def _short(exc: Exception, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}"
