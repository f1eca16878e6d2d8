"""An evaluation worker of the local pool (local_pool.py): a spawned process that judges its jobs one
at a time, the last tasks' references kept and the next jobs loaded ahead meanwhile (lookahead.py).

A worker is a trusted process: it prepares references and judges candidates, each of which runs in
its own sandboxed child. It reads jobs from its inbox and answers on a channel of its own
(worker_results.py): a note that it started a job, then the job's verdict, a broken task or the
evaluation's failure.
"""

from __future__ import annotations

import collections
import dataclasses
import faulthandler
import os
import queue
import signal
import time

from cuda_l1.errors import BrokenTask
from cuda_l1.evaluate import task_marks
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.jobs import TASK_ERROR, Evaluators
from cuda_l1.evaluate.worker_results import send

STARTED = "started"  # a worker's note that it began judging a job (not a verdict)


def worker_main(device: str, config: EvalConfig, inbox, results, owner_pid: int, marks) -> None:
    """Runs in a spawned process: judge jobs one at a time, the last tasks' references kept, the
    next `lookahead_of(config)` jobs loaded ahead meanwhile (lookahead.py)."""
    from cuda_l1.evaluate import crowding, lifeline

    # An interrupt (Ctrl-C reaches the whole process group) is the owner's to handle: it stops its
    # workers. Here it would only print a traceback from the middle of a job.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()  # a crash in native code leaves the Python stacks on stderr, not only an exit code
    lifeline.hold(owner_pid)  # before anything slow: the owner may already be gone
    # Spawning handed the channel over as an inheritable descriptor: a process the task's code starts
    # with it would keep the pipe open after this worker's death.
    os.set_inheritable(results.fileno(), False)
    # Wall-clock stamps of the worker's own start, given with its first verdict (timing.worker_start):
    # what a caller waits for before the first verdict, apart from the verdict itself.
    start: dict | None = {"process": time.time()}
    from cuda_l1.evaluate.fork_server import start_ahead

    server = start_ahead(config.sandbox, device)  # their imports overlap the worker's own, below
    from cuda_l1.evaluate.evaluator import Evaluator, prewarm_of
    from cuda_l1.evaluate.device_room import room_for
    from cuda_l1.evaluate.jobs import KEEP_REFERENCES
    from cuda_l1.evaluate.lookahead import Lookahead, load_ahead, lookahead_of
    from cuda_l1.evaluate.probe import PROBE_ENDED, PROBE_SECONDS
    from cuda_l1.evaluate.task_env import prime_supply
    from cuda_l1.evaluate.side_supply import SideSupply

    config = dataclasses.replace(config, device=device)
    # One supply for all of the worker's tasks: the sides a new task needs (its reference's and its
    # first candidate's) were started during the previous task's evaluations, and the first task's
    # while the worker waited for it.
    start["imported"] = time.time()
    supply = SideSupply(prewarm_of(config), spares=config.spares)
    prime_supply(supply, config)
    start["spares_started"] = time.time()
    depth = lookahead_of(config)
    # One more prepared task than without lookahead: the next one, prepared while this one is judged.
    task_marks.install(marks)  # a death while a task's own code runs here is the task's
    evaluators = Evaluators(lambda task: Evaluator(task, config, supply=supply),
                            keep=KEEP_REFERENCES + (1 if depth else 0), quiet_lock=supply.gate,
                            room=room_for(config.device, config.task_timeout_s),
                            wait_s=2 * config.task_timeout_s + config.load_timeout_s)
    ahead = Lookahead(evaluators, depth)
    queued: collections.deque = collections.deque()
    while True:
        try:  # wait only when there is nothing to do; take whatever else has arrived
            item = inbox.get() if not queued else inbox.get_nowait()
            while item is not None:
                queued.append(item)
                item = inbox.get_nowait()
        except queue.Empty:
            item = ...
        if item is None:
            ahead.close()
            evaluators.close()
            supply.close()
            return
        for job in [job for job in queued if job[1].id in evaluators.broken]:  # answered now, never loaded
            queued.remove(job)
            send(results, (job[0], TASK_ERROR, evaluators.broken[job[1].id]))
        if not queued:
            continue
        busy = {job[1].id for job in queued}
        load_ahead(ahead, list(queued), depth, set(evaluators.task_ids()), busy)
        job_id, task, source, best, thresholds = queued.popleft()
        send(results, (job_id, STARTED, None))  # a death from now on is this job's
        if start is not None:
            start.setdefault("first_job", time.time())
        try:
            evaluator, preloaded, error = ahead.take(job_id, timeout_s=config.timeout_s + 60)
            if error is not None or evaluator is None:  # a reference failing beside other tasks: crowding.py
                evaluator = crowding.prepare(evaluators, ahead, task, busy, failure=error)  # (again, alone)
            ready_at = time.time()  # its reference started, its candidate loaded
            evaluator.config.best_known_speedup = best
            verdict = crowding.judge(evaluator, source, device=device, evaluators=evaluators, task=task,
                                     ahead=ahead, thresholds=thresholds, preloaded=preloaded)
            if start is not None:
                start["task_ready"], start["judged"] = ready_at, time.time()
                start["probe_s"] = round(sum(PROBE_SECONDS.values()), 2)  # a duration, not a stamp
                if device in PROBE_ENDED:
                    start["probed"] = PROBE_ENDED[device]
                for name, stage in (("fork_server_ready", server), ("compilers_ready", server and server.compilers)):
                    if stage is not None and stage.ready_at is not None:  # its first stage, its second (fork_server.py)
                        start[name] = stage.ready_at
                verdict.timing["worker_start"], start = start, None
            send(results, (job_id, verdict.to_dict(), None))
        except BrokenTask as exc:  # the task's reference failed in this process: the caller's bad input
            send(results, (job_id, TASK_ERROR, str(exc)))
        except Exception as exc:  # the evaluation failed: a runtime_error verdict, judged again later
            send(results, (job_id, None, f"{type(exc).__name__}: {exc}"))
