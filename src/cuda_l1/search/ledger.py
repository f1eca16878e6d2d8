"""What a run has spent and what happened in it: completion counts from the store, and an event log.

The store answers "what is recorded" per task and candidate; the loop also needs it per run (its
budget is the completions recorded for a task *in this run*) and for reports (unusable completions
have no verdict, yet count as failed attempts). Those reads go through a separate read-only
connection, so the one writing connection stays the Store's.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from pathlib import Path

from cuda_l1.evaluate.verdict import PARSE_ERROR, Verdict
from cuda_l1.store.records import origin_label
from cuda_l1.tasks import Task


def run_completions(db_path: str | Path, run_id: int) -> list[dict]:
    """Every completion recorded for a prompt of this run, oldest first."""
    uri = f"{Path(db_path).resolve().as_uri()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(
            """SELECT c.id, c.prompt_id, c.task_id, c.model, c.endpoint, c.finish_reason, c.parse_status,
                      c.parse_message, c.candidate_id, c.prompt_tokens, c.completion_tokens, c.created_at
               FROM completions c JOIN prompts p ON p.id = c.prompt_id
               WHERE p.run_id = ? ORDER BY c.id""",
            (run_id,),
        ).fetchall()
    finally:
        conn.close()
    return [dict(r) for r in rows]


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
