"""A task's reference run once here, before its candidates are judged: a broken one is bad input (a
TaskError naming its file and line), found before the minutes of judging (eval, optimize, calibrate)
or left to the run that judges the other tasks first (bench, audit: evaluate_candidates)."""

from __future__ import annotations

from typing import Iterable

from cuda_l1.devices import Device
from cuda_l1.errors import TaskError
from cuda_l1.tasks import Task
from cuda_l1.tasks.deadline import DEFAULT_TASK_TIMEOUT_S


def references_that_run(tasks: Iterable[Task], device: Device, want: int, mode: str = "train",
                         timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S, tries: int = 8) -> list[Task]:
    """The first `want` of `tasks` whose reference runs here (check_references, one at a time, at most
    `tries`): for a run's noise check, which must not end the run on a broken task before any verdict
    (the run reports that task with its candidates, evaluate_candidates)."""
    found: list[Task] = []
    for task in list(tasks)[:tries]:
        if len(found) >= want:
            break
        try:
            check_references([task], device, mode=mode, timeout_s=timeout_s)
        except TaskError:
            continue
        found.append(task)
    return found


def check_references(tasks: Iterable[Task], device: Device, mode: str = "train",
                     timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S) -> dict:
    """Run every distinct reference once here, so that a broken one is reported as bad input (exit 2)
    instead of as a failing verdict of each candidate: for callers of a few tasks (eval, optimize,
    calibrate), in the module mode they judge in, each within `timeout_s` (EvalConfig.task_timeout_s). Skipped for GPUs that only a cluster has. Returns
    {"checked": how many ran, "seconds"}."""
    import time

    import torch

    from cuda_l1.tasks.runtime import check_reference

    result = {"checked": 0, "seconds": 0.0}
    if device.remote:
        return result
    started = time.perf_counter()
    for task in {task.id: task for task in tasks}.values():
        check_reference(task, str(device), mode=mode, timeout_s=timeout_s)
        result["checked"] += 1
    if device.is_cuda and result["checked"]:
        torch.cuda.empty_cache()  # the checked models are gone; give their memory back to the workers
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result
