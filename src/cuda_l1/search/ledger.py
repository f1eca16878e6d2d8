"""What a run has spent and what happened in it: budgets from the run's completions, and an event log.

The loop's budget is the completions recorded for a task *in this run* (`Store.run_completions`),
and reports count unusable completions, which have no verdict, as failed attempts.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from cuda_l1.evaluate.verdict import PARSE_ERROR, Verdict
from cuda_l1.store.records import origin_label
from cuda_l1.tasks import Task


def spent_per_task(completions: list[dict]) -> Counter:
    """Budget used per task id: every recorded completion, usable or not."""
    return Counter(c["task_id"] for c in completions)


def parse_error_rows(completions: list[dict], tasks: dict[str, Task], device: str) -> list[dict]:
    """Report rows (the shape of `Store.run_results`) for the completions that held no usable code."""
    rows = []
    for c in completions:
        if c["parse_status"] != PARSE_ERROR:
            continue
        task = tasks.get(c["task_id"])
        name = task.name if task else c["task_id"]
        verdict = Verdict(status=PARSE_ERROR, reasons=[c["parse_message"] or "no usable code"], device=device,
                          task_id=c["task_id"], task_name=task.key if task else name)
        rows.append({
            "task_id": c["task_id"],
            "task_name": name,
            "level": task.level if task else 0,
            "origin": origin_label({"kind": "llm", "model": c["model"]}),
            "candidate_id": "",
            "verdict": verdict.to_dict(),
        })
    return rows


class EventLog:
    """Append-only JSON lines: what the loop did, in order (a kill loses at most the line being written)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("a", encoding="utf-8", buffering=1)

    def write(self, event: str, **fields) -> None:
        if self._handle.closed:
            return
        self._handle.write(json.dumps({"t": round(time.time(), 3), "event": event, **fields}, default=str) + "\n")

    def close(self) -> None:
        self._handle.close()


def read_events(path: str | Path) -> list[dict]:
    """The events of a log, skipping a last line cut short by a kill."""
    events = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events
