"""The history store: every task, candidate, verdict, prompt and completion, in one SQLite file.

One process writes (the one that owns the Store); its threads share one connection behind a lock.
Every write is one transaction that is committed before the method returns, so what a method
reports as recorded survives kill -9, and idempotent keys (content hashes, the verdict uniqueness
constraint) make a rerun resume instead of double-counting.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from cuda_l1.errors import UserError
from cuda_l1.evaluate.reference_drift import reference_stable
from cuda_l1.evaluate.verdict import ALL_STATUSES, OK, REJUDGE_CHECK, Check, Verdict
from cuda_l1.store.normalize import candidate_id as code_id
from cuda_l1.store.normalize import norm_hash, stable_key
from cuda_l1.store.records import CANDIDATE_COLUMNS, CandidateRecord, Origin, RunRecord, candidate_record, row_json
from cuda_l1.store.schema import connect
from cuda_l1.store.verdict_queries import VerdictQueries
from cuda_l1.tasks.task import Task


class Store(VerdictQueries):
    """History DB. `Store(path)` opens (creating and migrating) it; use as a context manager or close().

    The writes are here; the queries over verdicts (resume, duplicates, best candidates, failures, run
    results) are inherited from `VerdictQueries`.
    """

    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = connect(self.path, readonly=readonly)

    @classmethod
    def open(cls, path: str | Path, readonly: bool = False) -> "Store":
        return cls(path, readonly=readonly)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ValueError(f"the history store {self.path} is closed")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed (durably) before the caller's method returns."""
        if self.readonly:
            raise UserError("the history DB was opened read-only; this operation writes.", path=str(self.path))
        with self._lock:
            conn = self._connection()
            # IMMEDIATE takes the write lock up front, so a busy DB waits here (busy_timeout)
            # instead of failing halfway through the transaction.
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _read(self, sql: str, params: Sequence = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._connection().execute(sql, params).fetchall()

    # -- runs and tasks -------------------------------------------------------------------------------

    def start_run(self, name: str, config: dict | None = None, notes: str = "") -> int:
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO runs (name, created_at, config, notes) VALUES (?, ?, ?, ?)",
                (name, time.time(), json.dumps(config or {}, sort_keys=True, default=str), notes),
            )
            return int(cur.lastrowid)

    def set_run_notes(self, run_id: int, notes: str) -> None:
        with self._write() as conn:
            conn.execute("UPDATE runs SET notes = ? WHERE id = ?", (notes, run_id))

    def runs(self, name: str | None = None) -> list[RunRecord]:
        """All runs (or those with this name), oldest first."""
        where, params = ("WHERE name = ?", (name,)) if name is not None else ("", ())
        rows = self._read(f"SELECT * FROM runs {where} ORDER BY id", params)
        return [RunRecord(r["id"], r["name"], r["created_at"], row_json(r["config"], {}), r["notes"]) for r in rows]

    def note_task_not_run(self, run_id: int, task_id: str, why: str) -> None:
        """Record that a run could not judge a task (its reference fails there); the first reason stands."""
        with self._write() as conn:
            conn.execute("INSERT INTO tasks_not_run (run_id, task_id, why, noted_at) VALUES (?, ?, ?, ?)"
                         " ON CONFLICT (run_id, task_id) DO NOTHING", (run_id, task_id, why, time.time()))

    def clear_tasks_not_run(self, run_id: int, task_ids) -> None:
        """Forget what `run_id` noted of these tasks: a resumed run judges them again (and notes them anew)."""
        with self._write() as conn:
            conn.executemany("DELETE FROM tasks_not_run WHERE run_id = ? AND task_id = ?",
                             [(run_id, task_id) for task_id in set(task_ids)])

    def tasks_not_run(self, run_id: int) -> dict[str, dict]:
        """task id -> {"task": its key, "why": ...} for the tasks `run_id` could not judge."""
        rows = self._read("SELECT n.why, t.* FROM tasks_not_run n JOIN tasks t ON t.id = n.task_id"
                          " WHERE n.run_id = ? ORDER BY n.noted_at", (run_id,))
        return {r["id"]: {"task": _task(r).key, "why": r["why"]} for r in rows}

    def add_task(self, task: Task) -> str:
        """Record a task (idempotent: a task is its source hash) and return its id."""
        with self._write() as conn:
            conn.execute(
                "INSERT INTO tasks (id, name, level, number, source, origin, description, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (task.id, task.name, task.level, task.number, task.source, task.origin, task.description, time.time()),
            )
        return task.id

    def get_task(self, task_id: str) -> Task | None:
        rows = self._read("SELECT * FROM tasks WHERE id = ?", (task_id,))
        return _task(rows[0]) if rows else None

    def tasks(self) -> list[Task]:
        return [_task(r) for r in self._read("SELECT * FROM tasks ORDER BY level, number IS NULL, number, name")]

    # -- candidates -----------------------------------------------------------------------------------

    def add_candidate(
        self, task_id: str, code: str, origin: Origin | dict | str, run_id: int | None = None
    ) -> tuple[str, bool]:
        """Record candidate code for a task; returns (candidate_id, is_new). Re-adding is a no-op."""
        origin = Origin.coerce(origin)
        cid = code_id(code)
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM tasks WHERE id = ?", (task_id,)).fetchone() is None:
                raise ValueError(f"unknown task {task_id}; add_task() it first")
            cur = conn.execute(
                "INSERT INTO candidates (task_id, id, code, norm_hash, origin, run_id, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (task_id, id) DO NOTHING",
                (task_id, cid, code, norm_hash(code), origin.to_json(), run_id, time.time()),
            )
            is_new = cur.rowcount == 1
            if run_id is not None:
                conn.execute(
                    "INSERT INTO run_candidates (run_id, task_id, candidate_id, seq)"
                    " SELECT ?, ?, ?, COALESCE(MAX(seq), 0) + 1 FROM run_candidates WHERE run_id = ?"
                    " ON CONFLICT DO NOTHING",
                    (run_id, task_id, cid, run_id),
                )
        return cid, is_new

    def get_candidate(self, candidate_id: str, task_id: str | None = None) -> CandidateRecord | None:
        task_id = self._task_of(candidate_id, task_id)
        rows = self._read(
            f"SELECT {CANDIDATE_COLUMNS} FROM candidates c WHERE c.task_id = ? AND c.id = ?", (task_id, candidate_id)
        )
        return candidate_record(rows[0]) if rows else None

    # -- verdicts -------------------------------------------------------------------------------------

    def record_verdict(
        self,
        candidate_id: str,
        verdict: Verdict,
        run_id: int | None = None,
        device: str | None = None,
        config_key: str | dict = "",
        task_id: str | None = None,
        reference_sample: bool = True,
    ) -> bool:
        """Store a verdict once per (candidate, device, config key). Returns False if one was already
        stored. An unsettled one (Verdict.settled: the evaluation itself failed) is not a finding about
        the program: the next verdict replaces it, with `attempts` counting the evaluations.

        config_key: a string, or the evaluation settings themselves (hashed with `stable_key`).
        reference_sample: the verdict's reference timing is a new measurement (False for a copy of a
        verdict filed under a duplicate candidate: the same measurement must not count twice).
        """
        device = device or verdict.device
        if not device:
            raise ValueError("record_verdict needs a device (or a verdict whose device is set)")
        if verdict.status not in ALL_STATUSES:
            raise ValueError(f"unknown verdict status {verdict.status!r}")
        task_id = self._task_of(candidate_id, task_id or verdict.task_id or None)
        if task_id is None:
            raise ValueError(f"unknown candidate {candidate_id}; add_candidate() it first")
        for name, ours in (("task_id", task_id), ("candidate_id", candidate_id)):
            theirs = getattr(verdict, name)
            if theirs and theirs != ours:
                raise ValueError(f"the verdict is for {name} {theirs}, not {ours}: refusing to file it")
        stored = dataclasses.replace(verdict, task_id=task_id, candidate_id=candidate_id)
        ci = list(verdict.ci) if verdict.ci and len(verdict.ci) == 2 else [None, None]
        with self._write() as conn:
            if conn.execute(
                "SELECT 1 FROM candidates WHERE task_id = ? AND id = ?", (task_id, candidate_id)
            ).fetchone() is None:
                raise ValueError(f"unknown candidate {candidate_id} of task {task_id}; add_candidate() it first")
            before = self._stored_row(conn, task_id, candidate_id, device, config_key)
            if before is not None:
                replaced = Verdict.from_json(before["verdict"])
                if replaced.settled:
                    return False
                stored.attempts = replaced.attempts + 1
                reopened = replaced.check(REJUDGE_CHECK)
                if reopened is not None and reopened.passed is False:  # what it replaces stays on record
                    stored.timing = {**stored.timing, "replaced": {
                        "status": replaced.status, "speedup": replaced.speedup, "raw_speedup": replaced.raw_speedup,
                        "reasons": replaced.reasons[:3], "why": reopened.detail}}
            reference = self._reference_update(task_id, stored) if reference_sample else None
            if reference is not None:
                stored.checks = [*stored.checks, reference[0]]
            if before is not None:
                conn.execute(
                    """UPDATE verdicts SET run_id = ?, status = ?, speedup = ?, raw_speedup = ?, reference_ms = ?,
                           candidate_ms = ?, ci_low = ?, ci_high = ?, verdict = ?, created_at = ? WHERE id = ?""",
                    (run_id, verdict.status, verdict.speedup, verdict.raw_speedup, verdict.reference_ms,
                     verdict.candidate_ms, ci[0], ci[1], stored.to_json(), time.time(), before["id"]))
                if reference is not None:
                    self._upsert_reference(conn, task_id, stored.device, stored.versions, reference[1])
                return True
            cur = conn.execute(
                """INSERT INTO verdicts (task_id, candidate_id, run_id, device, config_key, status, speedup,
                       raw_speedup, reference_ms, candidate_ms, ci_low, ci_high, verdict, created_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (task_id, candidate_id, device, config_key) DO NOTHING""",
                (task_id, candidate_id, run_id, device, stable_key(config_key), verdict.status, verdict.speedup,
                 verdict.raw_speedup, verdict.reference_ms, verdict.candidate_ms, ci[0], ci[1],
                 stored.to_json(), time.time()),
            )
            if cur.rowcount == 1 and reference is not None:
                self._upsert_reference(conn, task_id, stored.device, stored.versions, reference[1])
            return cur.rowcount == 1

    def reopen_verdict(self, candidate_id: str, device: str, config_key: str | dict, why: str,
                       task_id: str | None = None) -> bool:
        """Make a stored verdict unsettled (a failed `rejudge` check, its attempts back to 0), so that
        the next evaluation of the program replaces it, noting in itself what it replaced (`--rejudge`:
        a verdict the user no longer trusts, such as one given while the device was short of memory).
        False when there is no such verdict."""
        task_id = self._task_of(candidate_id, task_id)
        with self._write() as conn:
            row = self._stored_row(conn, task_id, candidate_id, device, config_key)
            if row is None:
                return False
            verdict = Verdict.from_json(row["verdict"])
            verdict.checks = [c for c in verdict.checks if c.name != REJUDGE_CHECK] + [Check(REJUDGE_CHECK, False, why)]
            verdict.attempts = 0
            conn.execute("UPDATE verdicts SET verdict = ? WHERE id = ?", (verdict.to_json(), row["id"]))
            return True

    @staticmethod
    def _stored_row(conn, task_id: str, candidate_id: str, device: str, config_key: str | dict):
        """The (id, verdict) row of a candidate's verdict on a device under these settings, or None."""
        return conn.execute("SELECT id, verdict FROM verdicts WHERE task_id = ? AND candidate_id = ? AND device = ?"
                            " AND config_key = ?", (task_id, candidate_id, device, stable_key(config_key))).fetchone()

    # -- prompts and completions ----------------------------------------------------------------------

    def record_prompt(
        self, task_id: str, messages: list[dict], exemplar_ids: Sequence[str] = (), run_id: int | None = None
    ) -> int:
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO prompts (run_id, task_id, messages, exemplar_ids, created_at) VALUES (?, ?, ?, ?, ?)",
                (run_id, task_id, json.dumps(messages), json.dumps(list(exemplar_ids)), time.time()),
            )
            return int(cur.lastrowid)

    def record_completion(
        self,
        prompt_id: int,
        text: str,
        *,
        endpoint: str = "",
        model: str = "",
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        latency_s: float | None = None,
        cost: float | None = None,
        finish_reason: str | None = None,
        parse_status: str = OK,
        parse_message: str = "",
        candidate_id: str | None = None,
    ) -> int:
        """Record one LLM completion of a prompt (with its parsed candidate, once added, if any)."""
        with self._write() as conn:
            row = conn.execute("SELECT task_id FROM prompts WHERE id = ?", (prompt_id,)).fetchone()
            if row is None:
                raise ValueError(f"unknown prompt {prompt_id}; record_prompt() it first")
            cur = conn.execute(
                """INSERT INTO completions (prompt_id, task_id, endpoint, model, text, prompt_tokens,
                       completion_tokens, latency_s, cost, finish_reason, parse_status, parse_message,
                       candidate_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (prompt_id, row[0], endpoint, model, text, prompt_tokens, completion_tokens, latency_s, cost,
                 finish_reason, parse_status, parse_message, candidate_id, time.time()),
            )
            return int(cur.lastrowid)

    def prompt(self, prompt_id: int) -> dict | None:
        rows = self._read("SELECT * FROM prompts WHERE id = ?", (prompt_id,))
        if not rows:
            return None
        r = rows[0]
        return {"id": r["id"], "run_id": r["run_id"], "task_id": r["task_id"], "messages": row_json(r["messages"], []),
                "exemplar_ids": row_json(r["exemplar_ids"], []), "created_at": r["created_at"]}

    def completions(self, prompt_id: int) -> list[dict]:
        return [dict(r) for r in self._read("SELECT * FROM completions WHERE prompt_id = ? ORDER BY id", (prompt_id,))]

    def run_completions(self, run_id: int) -> list[dict]:
        """Every completion recorded for a prompt of this run, oldest first (the text left out)."""
        rows = self._read(
            """SELECT c.id, c.prompt_id, c.task_id, c.model, c.endpoint, c.finish_reason, c.parse_status,
                      c.parse_message, c.candidate_id, c.prompt_tokens, c.completion_tokens, c.created_at
               FROM completions c JOIN prompts p ON p.id = c.prompt_id
               WHERE p.run_id = ? ORDER BY c.id""",
            (run_id,),
        )
        return [dict(r) for r in rows]

    # -- reference timings ----------------------------------------------------------------------------
    # Every correct verdict carries the reference's median from its own paired rounds. The store keeps
    # those medians per task, device and software versions (a new torch, CUDA or driver starts a new
    # record). Speedups still come from the paired rounds, where reference and candidate share one
    # window; whether that window was a normal one is judged by `evaluate.reference_drift`, not here.
    # The store only hands it the kept medians, inside record_verdict's transaction, so the check and
    # the new median that follows it are filed together or not at all.

    reference_samples_kept = 20  # medians kept per task, device and versions (the latest ones)

    def _reference_update(self, task_id: str, verdict: Verdict) -> tuple[Check, dict] | None:
        """(the `reference_stable` check for this verdict, the record to store after it), or None.
        Called inside record_verdict's transaction, so it reads what that transaction sees."""
        if verdict.status != OK or not verdict.reference_ms or verdict.reference_ms <= 0:
            return None
        known = self.reference_timing(task_id, verdict.device, verdict.versions) or {}
        check = reference_stable(verdict.reference_ms, known)
        samples = (list(known.get("samples_ms") or []) + [verdict.reference_ms])[-self.reference_samples_kept:]
        return check, {"median_ms": sorted(samples)[len(samples) // 2], "samples_ms": samples,
                       "versions": verdict.versions}

    @staticmethod
    def _upsert_reference(conn, task_id: str, device: str, versions_key: str | dict, stats: dict) -> None:
        conn.execute(
            "INSERT INTO reference_timings (task_id, device, versions_key, stats, created_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (task_id, device, versions_key)"
            " DO UPDATE SET stats = excluded.stats, created_at = excluded.created_at",
            (task_id, device, stable_key(versions_key), json.dumps(stats, default=str), time.time()))

    def reference_timing(self, task_id: str, device: str, versions_key: str | dict) -> dict | None:
        """Stored reference statistics for a device name and its software versions (a dict, or a key
        string); kept by `record_verdict` from correct verdicts as {"median_ms", "samples_ms", "versions"}."""
        rows = self._read(
            "SELECT stats FROM reference_timings WHERE task_id = ? AND device = ? AND versions_key = ?",
            (task_id, device, stable_key(versions_key)),
        )
        return row_json(rows[0][0], None) if rows else None

    def save_reference_timing(self, task_id: str, device: str, versions_key: str | dict, stats: dict) -> None:
        with self._write() as conn:
            self._upsert_reference(conn, task_id, device, versions_key, stats)

    def integrity_check(self) -> str:
        return str(self._read("PRAGMA integrity_check")[0][0])


def _task(row: sqlite3.Row) -> Task:
    return Task(
        name=row["name"],
        level=row["level"],
        source=row["source"],
        origin=row["origin"],
        description=row["description"],
        number=row["number"],
    )
