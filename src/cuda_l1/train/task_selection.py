"""The tasks a stage trains on: chosen by its `[tasks]` table, and registered in the history store
before any candidate of theirs is recorded."""

from __future__ import annotations

from typing import Iterable

from cuda_l1.devices import local_gpu_count
from cuda_l1.errors import UserError
from cuda_l1.tasks import Task, for_device, load_tasks
from cuda_l1.train.config_files import EvalSection, TaskSection


def select_tasks(section: TaskSection, evaluation: EvalSection | None = None) -> list[Task]:
    """The tasks a stage trains on (UserError when the selection is empty). `builtin` comes at the
    sizes of the device that judges them (`evaluation`; cpu sizes without one)."""
    source = section.source
    if evaluation is not None:
        source = for_device(source, "cuda" if judged_on_gpu(evaluation) else "cpu")
    tasks = load_tasks(source, levels=set(section.levels) or None, ids=section.ids or None)
    if section.limit > 0:
        tasks = tasks[: section.limit]
    if not tasks:
        raise UserError(f"the task selection is empty (source {section.source!r}, levels {section.levels}, "
                        f"ids {section.ids}).")
    return tasks


def judged_on_gpu(evaluation: EvalSection) -> bool:
    """Whether the `[eval]` table names GPUs, read from its spelling only: every rank of a training job
    asks, and a rank need not see the evaluation's GPUs (the pool, on rank 0, checks them)."""
    first = (evaluation.device or "").split(",")[0].strip() or "cpu"
    if first == "auto":
        return evaluation.cluster != "local" or local_gpu_count() > 0
    return first.startswith("cuda")


def register_tasks(store, tasks: Iterable[Task]) -> None:
    for task in tasks:
        store.add_task(task)
