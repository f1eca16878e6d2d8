"""The tasks a stage trains on: chosen by its `[tasks]` table, and registered in the history store
before any candidate of theirs is recorded."""

from __future__ import annotations

from typing import Iterable

from cuda_l1.errors import UserError
from cuda_l1.tasks import Task, load_tasks
from cuda_l1.train.config import TaskSection


def select_tasks(section: TaskSection) -> list[Task]:
    """The tasks a stage trains on (UserError when the selection is empty)."""
    tasks = load_tasks(section.source, levels=set(section.levels) or None, ids=section.ids or None)
    if section.limit > 0:
        tasks = tasks[: section.limit]
    if not tasks:
        raise UserError(f"the task selection is empty (source {section.source!r}, levels {section.levels}, "
                        f"ids {section.ids}).")
    return tasks


def register_tasks(store, tasks: Iterable[Task]) -> None:
    for task in tasks:
        store.add_task(task)
