"""Reads over recorded verdicts: what a run has left to judge, what was already measured, the best
correct candidates, recent failures, and a run's results for its report.

`store.py` keeps the write path, whose concern is durability (one committed transaction per write,
idempotent keys); these queries answer what the search loop, the prompts and the reports need to
know, and change for those reasons. `Store` inherits them and supplies `_read`.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

from cuda_l1.evaluate.verdict import OK, PARSE_ERROR, Verdict
from cuda_l1.store.normalize import stable_key
from cuda_l1.store.records import (
    CANDIDATE_COLUMNS,
    CandidateRecord,
    FailureRecord,
    candidate_record,
    failure_message,
    origin_label,
    row_json,
)


class VerdictQueries:
    """Read-only queries over candidates and their verdicts; mixed into `Store`."""

    _read: Callable[..., list[sqlite3.Row]]  # supplied by Store: (sql, params) run under its lock
    runs: Callable[..., list]  # supplied by Store
    tasks_not_run: Callable[[int], dict[str, dict]]  # supplied by Store

    def _task_of(self, candidate_id: str, task_id: str | None) -> str | None:
        """The task of a candidate id (ids are per task: the same code may serve two tasks)."""
        if task_id:
            return task_id
        rows = self._read("SELECT task_id FROM candidates WHERE id = ?", (candidate_id,))
        if len(rows) > 1:
            raise ValueError(f"candidate {candidate_id} belongs to several tasks ({len(rows)}); pass task_id")
        return rows[0][0] if rows else None

    def unevaluated_candidates(
        self, run_id: int, device: str, config_key: str | None = None
    ) -> list[CandidateRecord]:
        """Candidates a run produced (or met again) with no verdict of their own on this device yet
        (exact source: see engine.py for why not the normalised code).

        config_key=None accepts a verdict under any evaluation settings. In the order the run met them.
        """
        key_filter = "" if config_key is None else "AND v.config_key = ?"
        params: list = [run_id, device] + ([] if config_key is None else [config_key])
        rows = self._read(
            f"""SELECT {CANDIDATE_COLUMNS} FROM run_candidates rc
                JOIN candidates c ON c.task_id = rc.task_id AND c.id = rc.candidate_id
                WHERE rc.run_id = ? AND NOT EXISTS (
                    SELECT 1 FROM verdicts v
                    WHERE v.task_id = c.task_id AND v.candidate_id = c.id AND v.device = ? {key_filter})
                ORDER BY rc.seq""",
            params,
        )
        return [candidate_record(r) for r in rows]

    def verdict_for(
        self, candidate_id: str, device: str, config_key: str | dict | None = None, task_id: str | None = None
    ) -> Verdict | None:
        """The latest verdict for a candidate on a device (under these settings, when given)."""
        task_id = self._task_of(candidate_id, task_id)
        if task_id is None:
            return None
        sql = "SELECT verdict FROM verdicts WHERE task_id = ? AND candidate_id = ? AND device = ?"
        params: list = [task_id, candidate_id, device]
        if config_key is not None:
            sql += " AND config_key = ?"
            params.append(stable_key(config_key))
        rows = self._read(sql + " ORDER BY id DESC LIMIT 1", params)
        return Verdict.from_json(rows[0][0]) if rows else None

    def correct_candidates(
        self,
        task_id: str,
        device: str | None = None,
        config_key: str | dict | None = None,
        run_id: int | None = None,
    ) -> list[CandidateRecord]:
        """Candidates whose latest verdict (on this device / settings / run) is ok, fastest first.

        One record per normalised code (the fastest). Pass a device: speedups measured on different
        GPUs are not comparable; with device=None each candidate's latest verdict on any device counts.
        """
        filters, params = ["v.task_id = ?"], [task_id]
        for column, value in (("device", device), ("config_key", config_key), ("run_id", run_id)):
            if value is not None:
                filters.append(f"v.{column} = ?")
                params.append(stable_key(value) if column == "config_key" else value)
        rows = self._read(
            f"""WITH latest AS (
                    SELECT v.*, ROW_NUMBER() OVER (PARTITION BY v.candidate_id ORDER BY v.id DESC) AS rank
                    FROM verdicts v WHERE {' AND '.join(filters)})
                SELECT {CANDIDATE_COLUMNS}, l.speedup, l.device, l.status, l.id AS verdict_id
                FROM latest l JOIN candidates c ON c.task_id = l.task_id AND c.id = l.candidate_id
                WHERE l.rank = 1 AND l.status = ? AND l.speedup IS NOT NULL
                ORDER BY l.speedup DESC, c.rowid""",
            params + [OK],
        )
        seen: set[str] = set()
        records = []
        for r in rows:
            if r["norm_hash"] not in seen:
                seen.add(r["norm_hash"])
                measured = {k: r[k] for k in ("speedup", "device", "status", "verdict_id")}
                records.append(candidate_record(r, **measured))
        return records

    def best_candidate(self, task_id: str, device: str | None = None, **filters) -> CandidateRecord | None:
        found = self.correct_candidates(task_id, device, **filters)
        return found[0] if found else None

    def recent_failures(self, task_id: str, n: int = 3, device: str | None = None) -> list[FailureRecord]:
        """The n most recent failures of a task, newest first: failed verdicts and unparseable completions."""
        if n <= 0:
            return []
        sql = "SELECT verdict, candidate_id, created_at FROM verdicts WHERE task_id = ? AND status != ?"
        params: list = [task_id, OK]
        if device is not None:
            sql += " AND device = ?"
            params.append(device)
        failures = []
        for r in self._read(sql + " ORDER BY id DESC LIMIT ?", params + [n]):
            verdict = Verdict.from_json(r["verdict"])
            message = failure_message(verdict)
            failures.append(
                FailureRecord(verdict.status, list(verdict.reasons), message, r["candidate_id"], r["created_at"])
            )
        for r in self._read(
            "SELECT parse_message, created_at FROM completions WHERE task_id = ? AND parse_status = ?"
            " ORDER BY id DESC LIMIT ?",
            (task_id, PARSE_ERROR, n),
        ):
            failures.append(FailureRecord(PARSE_ERROR, [r["parse_message"]], r["parse_message"], None, r["created_at"]))
        failures.sort(key=lambda f: f.created_at, reverse=True)
        return failures[:n]

    def all_verdicts(self) -> list[dict]:
        """Every stored verdict, in recording order: task_id, candidate_id, device, config_key and the
        verdict as a dict (what `verdict_file` writes)."""
        rows = self._read("SELECT task_id, candidate_id, device, config_key, verdict FROM verdicts ORDER BY id")
        return [{**dict(r), "verdict": row_json(r["verdict"], {})} for r in rows]

    def judged_results(self) -> tuple[list[dict], dict[str, dict]]:
        """Every run's results (run_results) but those of a task the run itself could not judge (an older
        verdict of it, reopened or resumed, which that run's report left out), and the tasks some run
        could not judge and none has a result of: task id -> {"task", "why"} (Store.tasks_not_run)."""
        rows, not_run = [], {}
        for run in self.runs():
            skipped = self.tasks_not_run(run.id)
            rows += [r for r in self.run_results(run.id) if r["task_id"] not in skipped]
            not_run.update(skipped)
        judged = {r["task_id"] for r in rows}
        return rows, {task_id: t for task_id, t in not_run.items() if task_id not in judged}

    def run_results(self, run_id: int) -> list[dict]:
        """One row per verdict recorded in a run, with its task and candidate, in recording order.

        Flat rows for reports: task fields, `origin` as a label (details in `origin_detail`), the verdict
        columns, and the full verdict as a dict under `verdict`.
        """
        rows = self._read(
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
