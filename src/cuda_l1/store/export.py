"""JSONL solution sets: the best verified candidate of each task, read from a Store.

The JSONL format is the one `cuda-l1 audit` (and `tasks.load_solutions_jsonl`) reads, so an
exported set can be re-verified from scratch by anyone. Exporting is a use of the store, not part
of it: this module reads the Store's queries, and the store does not know about exports.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from cuda_l1.store.store import Store
from cuda_l1.tasks.task import Task


def task_numbers(tasks: list[Task]) -> dict[str, int]:
    """The `task_id` field of each task: its KernelBench number, else an index after the level's numbers.

    Unnumbered tasks of a level are counted in name order from one past the level's highest number,
    so they never collide with a numbered task of the same level.
    """
    numbers: dict[str, int] = {}
    by_level: dict[int, list[Task]] = {}
    for task in tasks:
        by_level.setdefault(task.level, []).append(task)
    for level_tasks in by_level.values():
        taken = [t.number for t in level_tasks if t.number is not None]
        next_index = max(taken, default=0) + 1
        for task in sorted(level_tasks, key=lambda t: (t.number is None, t.number or 0, t.name, t.id)):
            if task.number is not None:
                numbers[task.id] = task.number
            else:
                numbers[task.id] = next_index
                next_index += 1
    return numbers


def solution_lines(store: Store, run_id: int | None = None, device: str | None = None) -> list[dict]:
    tasks = store.tasks()
    numbers = task_numbers(tasks)
    records = []
    for task in tasks:
        best = store.best_candidate(task.id, device, run_id=run_id)
        if best is None:
            continue
        records.append(
            {
                "level_id": task.level,
                "task_id": numbers[task.id],
                "task_name": task.name,
                "ref_code": task.source,
                "custom_code": best.code,
                "score_speedup": best.speedup,
                "candidate_id": best.candidate_id,
                "device": best.device,
            }
        )
    return records


def export_solutions_jsonl(
    store: Store, path: str | Path, run_id: int | None = None, device: str | None = None
) -> int:
    """Write the best verified candidate of each task (of this run / device, when given) as a JSONL
    solution set, one line per task that has one; returns the line count. Atomic: a crash leaves the
    old file."""
    path = Path(path)
    records = solution_lines(store, run_id=run_id, device=device)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return len(records)
