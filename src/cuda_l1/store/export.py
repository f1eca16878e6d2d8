"""Read-side views of the store: per-run result rows and JSONL solution sets.

The JSONL format is the one `cuda-l1 audit` (and `tasks.load_solutions_jsonl`) reads, so an
exported set can be re-verified from scratch by anyone.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from cuda_l1.store.records import origin_label, row_json
from cuda_l1.tasks.task import Task

if TYPE_CHECKING:
    from cuda_l1.store.store import Store


def run_results(read: Callable, run_id: int) -> list[dict]:
    """Flat rows for reports: task fields, `origin` as a label (details in `origin_detail`), the verdict
    columns, and the full verdict as a dict under `verdict`."""
    rows = read(
        """SELECT v.id AS verdict_id, v.run_id, t.id AS task_id, t.name AS task_name, t.level, t.number,
                  c.id AS candidate_id, c.norm_hash, c.origin, v.device, v.config_key, v.status, v.speedup,
                  v.raw_speedup, v.reference_ms, v.candidate_ms, v.ci_low, v.ci_high, v.created_at, v.verdict
           FROM verdicts v
           JOIN tasks t ON t.id = v.task_id
           JOIN candidates c ON c.task_id = v.task_id AND c.id = v.candidate_id
           WHERE v.run_id = ? ORDER BY v.id""",
        (run_id,),
    )
    results = []
    for r in rows:
        row = dict(r)
        verdict = row_json(row["verdict"], {})
        row["verdict"] = verdict
        row["origin_detail"] = row_json(row["origin"], {})
        row["origin"] = origin_label(row["origin_detail"])
        row["reasons"] = verdict.get("reasons", [])
        results.append(row)
    return results


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


def solution_lines(store: "Store", run_id: int | None = None, device: str | None = None) -> list[dict]:
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
    store: "Store", path: str | Path, run_id: int | None = None, device: str | None = None
) -> int:
    """Write one line per task that has a verified candidate; atomic (a crash leaves the old file)."""
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
