"""A verdict lost to a crowded device is judged again, alone.

A GPU worker holds the prepared references of its recent tasks and loads the next candidates ahead
(jobs.Evaluators, lookahead.py); device_room.py lets a task in beside them only when its inputs and
outputs fit. What a forward needs beyond them (a loss's temporaries, a reference side's cached
blocks, the float64 oracle's intermediates) is not known ahead. On KernelBench's level 1, the
cumsum and loss tasks (two 4 GiB inputs each) ran out of device memory beside the evaluations held
for the tasks before them: five verdicts failed in the evaluator and one blamed the candidate,
whose identical copy of the reference raised `torch.OutOfMemoryError` in its own forward.

So a verdict that names running out of device memory is not taken as it is when the device was
crowded by others: the worker drops its loads ahead and every evaluator it holds (this task's too,
since a side that ran out may be left in any state), prepares the task again and judges the
candidate once more with the device to itself. What that evaluation took of the device becomes the
task's need from then on (device_room.DeviceRoom.remember): it is kept in reserve while the task is
held, so that its next candidates are not judged beside too much again. The second verdict stands,
whatever it says: a candidate that runs out of memory alone is what it is; a retry that cannot be
prepared leaves the first verdict standing, with the reason noted.

The words are the candidate's to write (its forward can raise any message), so they are not enough:
the retry happens only when the parent's own reading of the device, taken after the candidate's
side has exited, shows less free memory than the task needs, i.e. others held what it lacked. A
candidate that says it ran out on an uncrowded device keeps its failure. One that says so on a
crowded device gets one more evaluation, at most once a job, with its best known speedup carried
over (the re-measure rule applies as before); the verdict notes it (`timing["crowded_retry"]`).
"""

from __future__ import annotations

import gc
from typing import Any

from cuda_l1.errors import BrokenTask
from cuda_l1.evaluate.device_room import HEADROOM_BYTES
from cuda_l1.evaluate.jobs import PreparationWait
from cuda_l1.evaluate.verdict import Verdict

# How PyTorch's caching allocator and the driver say it (torch.OutOfMemoryError's message, its type
# name in a traceback, cuMemAlloc's status through cudadrv).
OUT_OF_MEMORY_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "CUDA_ERROR_OUT_OF_MEMORY")
DROP_WAIT_S = 60.0  # how long a load ahead under way is waited for; one still loading is stopped when it ends


def ran_out_of_device_memory(verdict: Verdict) -> bool:
    """Whether a failed verdict says the device's memory ran out (in either side or the evaluator)."""
    if verdict.ok:
        return False
    text = "\n".join(verdict.reasons) + "\n" + "\n".join(c.detail for c in verdict.checks if c.passed is False)
    return any(marker in text for marker in OUT_OF_MEMORY_MARKERS)


def prepare(evaluators: Any, ahead: Any | None, task: Any, busy, failure: BaseException | None = None) -> Any:
    """`evaluators.get(task, busy)`, prepared again alone when its reference failed beside what the
    worker holds on a GPU. A preparation runs the reference once on the device (TaskEnv), and a
    failure there is the task's error (BrokenTask: bad input, which ends a bench). Beside other
    tasks' evaluations it may be the device's state instead (out of memory, in words no list of
    markers holds: a cuBLAS or cuDNN handle that cannot be made says it otherwise), so before it is
    taken as the task's, the worker drops what it holds and prepares the task once more; a broken
    reference fails again, alone. `failure`: the error of a preparation made ahead (lookahead.py).
    A task found broken stays broken for this worker (`evaluators.broken`): its other candidates are
    answered at once, not by running a reference that failed (up to its deadline) once per candidate."""
    known = evaluators.broken.get(task.id)
    if known is not None:
        raise BrokenTask(known)
    try:
        return _prepare(evaluators, ahead, task, busy, failure)
    except BrokenTask as exc:
        if not isinstance(exc, PreparationWait):  # (a wait that ran out proves nothing of the reference)
            evaluators.broken[task.id] = str(exc)
        raise


def _prepare(evaluators: Any, ahead: Any | None, task: Any, busy, failure: BaseException | None) -> Any:
    if failure is None:
        try:
            return evaluators.get(task, busy)
        except BrokenTask as exc:
            failure = exc
    if not isinstance(failure, BrokenTask) or evaluators.room is None:  # (no device room: not a GPU)
        raise failure
    # (TaskEnv raises a BrokenTask outside its handler: no traceback of it keeps the failed run's tensors.)
    if clear_device(evaluators, ahead, task.id) <= 0:
        raise failure
    gc.collect()
    evaluators.room.release_cached()
    return evaluators.get(task, busy)


def clear_device(evaluators: Any, ahead: Any | None, task_id: str) -> int:
    """Drop what a worker holds on its device: loads ahead first (their threads may be preparing
    tasks), then every held evaluator. Returns how many of them were there beside `task_id`'s own
    evaluator (every load ahead counts: a loaded candidate's side holds its model on the device)."""
    dropped = ahead.drop_all(timeout_s=DROP_WAIT_S) if ahead is not None else 0
    return dropped + sum(1 for held in evaluators.retire_all() if held != task_id)


def crowded(room: Any, task: Any) -> bool:
    """Whether the device has less memory free than `task` needs (the parent's reading; a worker
    without a device room has no device to be crowded)."""
    return room is not None and room.free() < room.need(task) + HEADROOM_BYTES


def judge(evaluator: Any, source: str, *, device: str, evaluators: Any, task: Any, ahead: Any | None = None,
          **evaluate_kwargs) -> Verdict:
    """`evaluator.evaluate(source, ...)`, judged again alone (see the module's docstring) when it ran
    out of device memory on a device crowded by others."""
    verdict = evaluator.evaluate(source, **evaluate_kwargs)
    if not device.startswith("cuda") or not ran_out_of_device_memory(verdict):
        return verdict
    room = evaluators.room
    if not crowded(room, task):  # room enough now that its side is gone: the failure is the candidate's
        return verdict
    beside = clear_device(evaluators, ahead, task.id)
    if beside <= 0:  # it was alone on the device: the finding stands
        return verdict
    evaluate_kwargs.pop("preloaded", None)  # the load ahead was dropped with the others
    free_alone = room.free()
    try:
        alone = evaluators.get(task)
        alone.config.best_known_speedup = evaluator.config.best_known_speedup
        again = alone.evaluate(source, **evaluate_kwargs)
    except Exception as exc:  # noqa: BLE001 - the task could not be prepared again: the first verdict stands
        verdict.timing["crowded_retry"] = {"beside": beside, "failed": f"{type(exc).__name__}: {exc}"[:300]}
        return verdict
    # What is gone now is about what the task's evaluation takes: the reference's side keeps its
    # cached blocks, and the candidate's side has exited (it cannot make its task's need larger).
    room.remember(task, free_alone - room.free())
    again.attempts = verdict.attempts + 1
    again.elapsed_s = round(verdict.elapsed_s + again.elapsed_s, 3)
    again.timing["crowded_retry"] = {
        "beside": beside,
        "first_status": verdict.status,
        "first_reason": (verdict.reasons[0] if verdict.reasons else "")[:300],
    }
    return again
