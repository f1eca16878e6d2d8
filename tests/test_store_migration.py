"""Schema migrations on real SQLite files: a store written by schema 1 (candidate ids over normalised
code) opened by this code gets exact-code ids everywhere, loses nothing, and is migrated once."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from cuda_l1.errors import UserError
from cuda_l1.evaluate.verdict import Verdict
from cuda_l1.store import SCHEMA_VERSION, Origin, Store, candidate_id, migrations, norm_hash, schema
from cuda_l1.store.migrations import v2_exact_candidate_ids
from cuda_l1.tasks import code_id, source_id
from cuda_l1.tasks.task import Task

INPUTS = "def get_inputs():\n    return [torch.rand(16)]\n\ndef get_init_inputs():\n    return []\n"
TASK_A = Task(name="3_Double", level=1, number=3, origin="test",
              source="import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
              + INPUTS)
TASK_B = Task(name="Plus", level=1, origin="test",
              source="import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"
              + INPUTS)

# The code of one candidate, as each task holds it: task A's copy has trailing whitespace and CRLF
# line ends, task B's is clean. Schema 1 gave both one id; from schema 2 on they are two programs.
CLEAN = ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
         "        return x \\\n            * 2\n")
SPACED = CLEAN.replace(" \\\n", " \\ \n").replace("\n", "\r\n")  # `\ ` at a line end: a syntax error
CHILD = CLEAN.replace("* 2", "* 2.0") + "   \n"  # an LLM candidate whose prompt showed SPACED


def v1_store(path: Path) -> dict:
    """A DB exactly as schema 1 code wrote it (ids = source_id of the code); returns what it holds."""
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in schema.MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    now = time.time()
    run = conn.execute("INSERT INTO runs (name, created_at, config) VALUES ('optimize', ?, '{}')", (now,)).lastrowid
    for task in (TASK_A, TASK_B):
        conn.execute("INSERT INTO tasks (id, name, level, number, source, origin, description, created_at)"
                     " VALUES (?, ?, ?, ?, ?, ?, '', ?)",
                     (task.id, task.name, task.level, task.number, task.source, task.origin, now))
    old = source_id(SPACED)
    assert old == source_id(CLEAN) and len(old) == 12  # the collision this schema change ends
    prompt = conn.execute("INSERT INTO prompts (run_id, task_id, messages, exemplar_ids, created_at)"
                          " VALUES (?, ?, '[]', ?, ?)", (run, TASK_A.id, json.dumps([old]), now)).lastrowid
    prompt_b = conn.execute("INSERT INTO prompts (run_id, task_id, messages, exemplar_ids, created_at)"
                            " VALUES (?, ?, '[]', ?, ?)", (run, TASK_B.id, json.dumps([old, "gone"]), now)).lastrowid
    child_origin = Origin(kind="llm", model="m", prompt_id=prompt, parent_ids=[old])
    rows = [(TASK_A.id, SPACED, Origin(kind="manual")), (TASK_B.id, CLEAN, Origin(kind="manual")),
            (TASK_A.id, CHILD, child_origin)]
    for seq, (task_id, code, origin) in enumerate(rows, start=1):
        cid = source_id(code)
        conn.execute("INSERT INTO candidates (task_id, id, code, norm_hash, origin, run_id, created_at)"
                     " VALUES (?, ?, ?, ?, ?, ?, ?)", (task_id, cid, code, norm_hash(code), origin.to_json(), run, now))
        conn.execute("INSERT INTO run_candidates (run_id, task_id, candidate_id, seq) VALUES (?, ?, ?, ?)",
                     (run, task_id, cid, seq))
        verdict = Verdict(status="ok", speedup=1.0 + seq, raw_speedup=1.0 + seq, device="cpu", task_id=task_id,
                          candidate_id=cid, reasons=[f"row {seq}"])
        conn.execute("INSERT INTO verdicts (task_id, candidate_id, run_id, device, config_key, status, speedup,"
                     " verdict, created_at) VALUES (?, ?, ?, 'cpu', 'k', 'ok', ?, ?, ?)",
                     (task_id, cid, run, verdict.speedup, verdict.to_json(), now + seq))
    conn.execute("INSERT INTO completions (prompt_id, task_id, text, parse_status, candidate_id, created_at)"
                 " VALUES (?, ?, 'answer', 'ok', ?, ?)", (prompt, TASK_A.id, source_id(CHILD), now))
    conn.close()
    return {"run": run, "prompt": prompt, "prompt_b": prompt_b}


def dump(path: Path) -> dict:
    """Every row of every table and the schema version (to compare a DB before and after)."""
    conn = sqlite3.connect(path)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    out = {t: sorted(conn.execute(f"SELECT rowid, * FROM {t}").fetchall(), key=repr) for t in tables}
    out["user_version"] = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.close()
    return out


def test_the_migration_spells_out_the_id_the_code_computes():
    for text in (CLEAN, SPACED, CHILD, "", "x = 'é'\n", "s = '\ud800'\n"):
        assert migrations._v2_code_id(text) == code_id(text) == candidate_id(text)


def test_a_schema_1_store_gets_exact_ids_and_every_reference_follows(tmp_path):
    path = tmp_path / "history.sqlite"
    held = v1_store(path)
    before = dump(path)
    spaced, clean, child = code_id(SPACED), code_id(CLEAN), code_id(CHILD)
    assert len({spaced, clean, child, source_id(SPACED), source_id(CHILD)}) == 5
    with Store(path) as store:
        assert store._read("PRAGMA user_version")[0][0] == SCHEMA_VERSION
        # Each candidate's id is its exact code's; the two copies of one old id now differ.
        ids = {(r["task_id"], r["id"]): r["code"] for r in store._read("SELECT task_id, id, code FROM candidates")}
        assert ids == {(TASK_A.id, spaced): SPACED, (TASK_B.id, clean): CLEAN, (TASK_A.id, child): CHILD}
        # Verdicts are found by the id the code computes now, with their own numbers, the JSON renamed too.
        for seq, (task, code) in enumerate(((TASK_A, SPACED), (TASK_B, CLEAN), (TASK_A, CHILD)), start=1):
            verdict = store.verdict_for(candidate_id(code), "cpu", "k", task_id=task.id)
            assert verdict.speedup == 1.0 + seq and verdict.candidate_id == candidate_id(code)
            assert verdict.task_id == task.id and verdict.reasons == [f"row {seq}"]
        assert store.get_candidate(spaced).code == SPACED  # one task holds it: no task_id needed any more
        # run_candidates (the run's resume list) and completions follow.
        assert [c.candidate_id for c in store.unevaluated_candidates(held["run"], "NVIDIA H200")] == [
            spaced, clean, child]
        assert store.unevaluated_candidates(held["run"], "cpu") == []
        [completion] = store.completions(held["prompt"])
        assert completion["candidate_id"] == child
        # Ids inside JSON follow, each within its own task; an id naming no candidate is kept.
        assert store.prompt(held["prompt"])["exemplar_ids"] == [spaced]
        assert store.prompt(held["prompt_b"])["exemplar_ids"] == [clean, "gone"]
        assert store.get_candidate(child).origin["parent_ids"] == [spaced]
        assert [r["candidate_id"] for r in store.run_results(held["run"])] == [spaced, clean, child]
        assert store._read("PRAGMA foreign_key_check") == [] and store.integrity_check() == "ok"
        after = dump(path)  # no row lost or added; rows keep their rowids (listings order by them)
        assert {t: sorted(r[0] for r in rows) for t, rows in after.items() if t in before and t != "user_version"} == {
            t: sorted(r[0] for r in rows) for t, rows in before.items() if t != "user_version"}
        assert not any(rows for t, rows in after.items() if t not in before)  # later migrations' tables start empty
        # New writes meet the migrated rows: re-adding a known code is no new candidate.
        assert store.add_candidate(TASK_A.id, SPACED, "manual") == (spaced, False)
        assert store.add_candidate(TASK_A.id, CLEAN, "manual") == (clean, True)  # its twin is one of its own
        assert store.verdict_for(clean, "cpu", "k", task_id=TASK_A.id) is None
    migrated = dump(path)
    with Store(path):  # opened again: nothing left to migrate, nothing changes
        pass
    assert dump(path) == migrated


def test_the_step_run_again_changes_nothing(tmp_path):
    path = tmp_path / "history.sqlite"
    v1_store(path)
    Store(path).close()
    before = dump(path)
    conn = schema.connect(path)
    conn.execute("BEGIN IMMEDIATE")
    v2_exact_candidate_ids(conn)
    conn.execute("COMMIT")
    conn.close()
    assert dump(path) == before


def test_a_failed_migration_keeps_the_old_ids_and_data(tmp_path, monkeypatch):
    path = tmp_path / "history.sqlite"
    v1_store(path)
    before = dump(path)
    broken = [schema.MIGRATIONS[0], [*schema.MIGRATIONS[1], "THIS IS NOT SQL"]]
    monkeypatch.setattr(schema, "MIGRATIONS", broken)
    with pytest.raises(sqlite3.OperationalError):
        Store(path)
    assert dump(path) == before  # version 1, schema-1 ids, every row as it was
    monkeypatch.undo()
    with Store(path) as store:  # the real migration still applies afterwards
        assert store.verdict_for(code_id(SPACED), "cpu", "k", task_id=TASK_A.id).speedup == 2.0


def test_a_schema_1_store_opened_read_only_asks_for_a_migration(tmp_path):
    path = tmp_path / "history.sqlite"
    v1_store(path)
    with pytest.raises(UserError, match="open it once for writing"):
        Store(path, readonly=True)


def test_a_process_still_writing_old_ids_into_a_migrated_store_is_stopped(tmp_path):
    # An older cuda-l1 that opened the store before the upgrade would go on inserting 12-digit ids,
    # rows no migration would ever fix (and a resumed run would stumble over).
    path = tmp_path / "history.sqlite"
    v1_store(path)
    Store(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    old_id = code_id(SPACED)[:12]
    with pytest.raises(sqlite3.IntegrityError, match="upgrade this process"):
        conn.execute("INSERT INTO candidates (task_id, id, code, norm_hash, origin, run_id, created_at)"
                     " VALUES (?, ?, 'x = 1', 'n', '{}', NULL, 0)", (TASK_A.id, old_id))
    with pytest.raises(sqlite3.IntegrityError, match="upgrade this process"):
        conn.execute("INSERT INTO verdicts (task_id, candidate_id, device, status, verdict, created_at)"
                     " VALUES (?, ?, 'cpu', 'ok', '{}', 0)", (TASK_A.id, old_id))
    indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"run_candidates_by_candidate", "completions_by_candidate"} <= indexes
    conn.close()
