"""The tasks a stage trains on: chosen by its `[tasks]` table, and registered in the history store
before any candidate of theirs is recorded."""

from __future__ import annotations

from typing import Iterable

from cuda_l1.devices import names_gpus
from cuda_l1.errors import UserError
from cuda_l1.tasks import Task, for_device, load_tasks
from cuda_l1.train.config_files import EvalSection, TaskSection


def select_tasks(section: TaskSection, evaluation: EvalSection | None = None) -> list[Task]:
    """The tasks a stage trains on (UserError when the selection is empty). `builtin` comes at the
    sizes of the device that judges them (`evaluation`; cpu sizes without one)."""
    source = section.source
    if evaluation is not None:
        # every rank asks, and a rank need not see the evaluation's GPUs: the spelling decides
        source = for_device(source, "cuda" if names_gpus(evaluation.device, evaluation.cluster) else "cpu")
    tasks = load_tasks(source, levels=set(section.levels) or None, ids=section.ids or None)
    if section.limit > 0:
        tasks = tasks[: section.limit]
    if not tasks:
        raise UserError(f"the task selection is empty (source {section.source!r}, levels {section.levels}, "
                        f"ids {section.ids}).")
    return tasks


def register_tasks(store, tasks: Iterable[Task]) -> None:
    for task in tasks:
        store.add_task(task)
