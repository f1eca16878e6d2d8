"""History store: real SQLite files in a temp dir, and real writer processes killed with SIGKILL."""

from __future__ import annotations

import ast
import dataclasses

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cuda_l1.errors import UserError
from cuda_l1.evaluate.reference_drift import REFERENCE_DRIFT_LIMIT, reference_stable
from cuda_l1.evaluate.verdict import Check, Verdict
from cuda_l1.store import SCHEMA_VERSION, Store, candidate_id, norm_hash, normalize_code, schema
from cuda_l1.store.export import export_solutions_jsonl
from cuda_l1.tasks import load_solutions_jsonl
from cuda_l1.tasks.task import Task, source_id

WRITER = Path(__file__).with_name("store_writer.py")

INPUTS = "def get_inputs():\n    return [torch.rand(16)]\n\ndef get_init_inputs():\n    return []\n"
REF_A = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n" + INPUTS
REF_B = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n" + INPUTS
TASK_A = Task(name="3_Double", level=1, number=3, source=REF_A, origin="test")
TASK_B = Task(name="Plus", level=1, source=REF_B, origin="test")  # no KernelBench number


def code(i: int, comment: str = "") -> str:
    return (f"import torch\n{comment}\nclass ModelNew(torch.nn.Module):\n"
            f"    def forward(self, x):\n        return x * {i}\n")


def ok(speedup: float, device: str = "cpu") -> Verdict:
    return Verdict(status="ok", speedup=speedup, raw_speedup=speedup * 1.01, reference_ms=2.0,
                   candidate_ms=2.0 / speedup, ci=[speedup * 0.9, speedup * 1.1], device=device)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "history.db") as s:
        s.add_task(TASK_A)
        s.add_task(TASK_B)
        yield s


# -- opening, pragmas, schema versions ---------------------------------------------------------------


def test_pragmas_and_version(store):
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    own = store._connection()
    assert own.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert own.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert own.execute("PRAGMA busy_timeout").fetchone()[0] == schema.BUSY_TIMEOUT_MS


def test_tasks_a_run_could_not_judge_are_kept_per_run(store):
    first, second = store.start_run("bench"), store.start_run("bench")
    store.note_task_not_run(first, TASK_A.id, "forward broke")
    store.note_task_not_run(first, TASK_A.id, "a later reason")  # the first reason stands
    store.note_task_not_run(second, TASK_B.id, "get_inputs raised")
    assert store.tasks_not_run(first) == {TASK_A.id: {"task": "L1/3_Double", "why": "forward broke"}}
    assert store.tasks_not_run(second) == {TASK_B.id: {"task": "L1/Plus", "why": "get_inputs raised"}}


def test_judged_results_leave_out_what_each_run_could_not_judge(store):
    """Each run's own list applies to its own rows; a task some run could not judge is listed only while
    no run has a result of it."""
    audit, bench = store.start_run("audit"), store.start_run("bench")
    a_id, _ = store.add_candidate(TASK_A.id, code(2), {"kind": "import"}, audit)
    store.record_verdict(a_id, ok(1.5), audit, device="cpu", config_key="k", task_id=TASK_A.id)
    store.note_task_not_run(audit, TASK_A.id, "ref broke")  # its verdict above is from before: left out
    rows, not_run = store.judged_results()
    assert rows == [] and list(not_run) == [TASK_A.id]
    b_id, _ = store.add_candidate(TASK_A.id, code(3), {"kind": "import"}, bench)
    store.record_verdict(b_id, ok(1.2), bench, device="cpu", config_key="k", task_id=TASK_A.id)
    rows, not_run = store.judged_results()
    assert [r["candidate_id"] for r in rows] == [b_id] and not_run == {}
    store.clear_tasks_not_run(audit, [TASK_A.id])
    assert store.tasks_not_run(audit) == {} and len(store.judged_results()[0]) == 2


def test_newer_schema_is_a_user_error(tmp_path):
    path = tmp_path / "h.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.commit()
    conn.close()
    with pytest.raises(UserError, match="newer"):
        Store(path)
    with pytest.raises(UserError, match="newer"):
        Store(path, readonly=True)


def test_not_a_database_is_a_user_error(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(UserError, match="SQLite"):
        Store(path)


def test_failed_migration_leaves_previous_version(tmp_path, monkeypatch):
    path = tmp_path / "h.db"
    Store(path).close()
    broken = schema.MIGRATIONS + [["CREATE TABLE extra (a INTEGER)", "THIS IS NOT SQL"]]
    monkeypatch.setattr(schema, "MIGRATIONS", broken)
    monkeypatch.setattr(schema, "SCHEMA_VERSION", len(broken))
    with pytest.raises(sqlite3.OperationalError):
        Store(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'extra'").fetchone() is None
    conn.close()


def test_reopen_keeps_data_and_readonly_refuses_writes(tmp_path):
    path = tmp_path / "h.db"
    with Store(path) as s:
        s.add_task(TASK_A)
        cid, _ = s.add_candidate(TASK_A.id, code(2), {"kind": "manual"})
        s.record_verdict(cid, ok(1.5))
    with Store(path, readonly=True) as ro:
        assert ro.get_task(TASK_A.id) == TASK_A
        assert ro.verdict_for(cid, "cpu").speedup == 1.5
        with pytest.raises(UserError, match="read-only"):
            ro.start_run("x", {})


# -- candidates and normalisation ----------------------------------------------------------------------


def test_store_modules_import_no_cycle():
    """Every import counts, function-level and TYPE_CHECKING ones too: e.g. the export reads the Store,
    so the store must not import the export back."""
    modules = {f.stem: f for f in Path(schema.__file__).parent.glob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "cuda_l1.store":
                edges[name] |= {a.name if a.name in modules else "__init__" for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cuda_l1.store."):
                edges[name].add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                edges[name] |= {a.name.split(".")[2] for a in node.names if a.name.startswith("cuda_l1.store.")}

    def in_a_cycle(start: str) -> bool:
        seen, todo = set(), list(edges[start])
        while todo:
            name = todo.pop()
            if name == start:
                return True
            if name not in seen:
                seen.add(name)
                todo.extend(edges.get(name, ()))
        return False

    assert [name for name in modules if in_a_cycle(name)] == []
    assert "export" not in edges["store"] and "store" in edges["export"]


def test_normalised_hash_ignores_layout_but_not_strings():
    base = "def f(x):\n    return x+1  # add\n"
    same = "# header\n\ndef f( x ):\n  return x + 1\n\n\n"
    assert norm_hash(base) == norm_hash(same)
    assert norm_hash(base) != norm_hash("def f(x):\n    return x+2\n")
    assert norm_hash('s = "a  b"\n') != norm_hash('s = "a b"\n')
    # Indentation structure still matters.
    assert norm_hash("if a:\n    b()\nc()\n") != norm_hash("if a:\n    b()\n    c()\n")
    # Truncated code cannot be tokenized; it falls back to stripped lines, which still ignore blank lines.
    cut = "x = foo(1,\n  2"
    assert normalize_code(cut).startswith("lines:")
    assert norm_hash(cut) == norm_hash("\n  x = foo(1,\n\n2   \n")
    assert normalize_code("x = 1\n").startswith("tok:")
    # f-strings keep their exact text (Python 3.12 tokenizes them in pieces; the form must not change).
    assert normalize_code('x=f"a{b!r:>{w}}  c"  # note\n') == 'tok:x = f"a{b!r:>{w}}  c"'


def test_add_candidate_is_idempotent_and_per_task(store):
    run = store.start_run("r", {"model": "m"})
    cid, new = store.add_candidate(TASK_A.id, code(2), {"kind": "llm", "model": "m", "prompt_id": None}, run)
    assert new
    again, new_again = store.add_candidate(TASK_A.id, code(2), {"kind": "manual"}, run)
    assert (again, new_again) == (cid, False)
    assert store.get_candidate(cid).origin["kind"] == "llm"  # the first origin is kept
    # The same code may serve another task (same Model, other inputs): a separate candidate.
    other, new_other = store.add_candidate(TASK_B.id, code(2), {"kind": "manual"})
    assert other == cid and new_other
    with pytest.raises(ValueError, match="several tasks"):
        store.verdict_for(cid, "cpu")
    assert store.verdict_for(cid, "cpu", task_id=TASK_A.id) is None
    with pytest.raises(ValueError, match="origin kind"):
        store.add_candidate(TASK_A.id, code(3), {"kind": "magic"})
    with pytest.raises(ValueError, match="unknown task"):
        store.add_candidate("nosuchtask", code(3), "manual")


def test_verdict_is_stored_once_per_device_and_config(store):
    cid, _ = store.add_candidate(TASK_A.id, code(2), "manual")
    assert store.record_verdict(cid, ok(1.5), config_key={"warmup": 10})
    assert not store.record_verdict(cid, ok(9.0), config_key={"warmup": 10})  # duplicate: first one wins
    assert store.record_verdict(cid, ok(1.4), config_key={"warmup": 20})  # other settings: another verdict
    assert store.record_verdict(cid, ok(2.5, device="NVIDIA H200"))
    assert store.verdict_for(cid, "cpu", {"warmup": 10}).speedup == 1.5
    assert store.verdict_for(cid, "cpu").speedup == 1.4  # latest on the device
    assert store.verdict_for(cid, "NVIDIA H200").speedup == 2.5
    rows = store._read("SELECT COUNT(*) FROM verdicts WHERE candidate_id = ?", (cid,))
    assert rows[0][0] == 3
    stored = store.verdict_for(cid, "cpu", {"warmup": 10})
    assert stored.candidate_id == cid and stored.task_id == TASK_A.id and stored.ci == pytest.approx([1.35, 1.65])


def test_record_verdict_rejects_mismatches(store):
    cid, _ = store.add_candidate(TASK_A.id, code(2), "manual")
    with pytest.raises(ValueError, match="refusing"):
        store.record_verdict(cid, Verdict(status="ok", speedup=1.0, device="cpu", candidate_id="ffffffffffff"))
    with pytest.raises(ValueError, match="status"):
        store.record_verdict(cid, Verdict(status="great", device="cpu"))
    with pytest.raises(ValueError, match="device"):
        store.record_verdict(cid, Verdict(status="ok", speedup=1.0))
    with pytest.raises(ValueError, match="unknown candidate"):
        store.record_verdict("000000000000", ok(1.0))


def test_a_layout_twin_has_no_verdict_of_its_program(store):
    """Norm-hash twins group in listings but never share a verdict: a program can read its layout."""
    first, _ = store.add_candidate(TASK_A.id, code(2), "manual")
    store.record_verdict(first, ok(1.7))
    twin = code(2, comment="# the same program, reformatted").replace("x * 2", "x*2")
    twin_id, new = store.add_candidate(TASK_A.id, twin, "manual")
    assert new and twin_id != first and norm_hash(twin) == norm_hash(code(2))
    assert store.verdict_for(twin_id, "cpu") is None
    assert not hasattr(store, "find_evaluated_duplicate")


def test_whitespace_twins_are_two_candidates_with_their_own_verdicts(store):
    """One trailing space or CRLF line ends make another program (here `\\ ` at a line end is a
    syntax error, the stripped line a continuation): its own id, row and verdicts."""
    valid = "x = 1 + \\\n    2\n"
    broken = valid.replace("\\\n", "\\ \n")
    crlf = valid.replace("\n", "\r\n")
    compile(valid, "valid", "exec")
    with pytest.raises(SyntaxError):
        compile(broken, "broken", "exec")
    assert source_id(valid) == source_id(broken) == source_id(crlf)  # one normalised text: tasks alone use it
    ids = [store.add_candidate(TASK_A.id, c, "manual") for c in (valid, broken, crlf)]
    assert all(new for _, new in ids) and len({cid for cid, _ in ids}) == 3
    assert [cid for cid, _ in ids] == [candidate_id(c) for c in (valid, broken, crlf)]
    (valid_id, _), (broken_id, _), (crlf_id, _) = ids
    store.record_verdict(valid_id, ok(1.5))
    store.record_verdict(broken_id, Verdict(status="compile_error", device="cpu", reasons=["SyntaxError"]))
    assert store.verdict_for(valid_id, "cpu").status == "ok"
    assert store.verdict_for(broken_id, "cpu").status == "compile_error"
    assert store.verdict_for(crlf_id, "cpu") is None  # judged by nobody yet
    assert store.get_candidate(broken_id).code == broken and store.get_candidate(crlf_id).code == crlf
    assert [c.candidate_id for c in store.correct_candidates(TASK_A.id, "cpu")] == [valid_id]


def test_correct_and_best_candidates(store):
    ids = {}
    for i, (speedup, status) in enumerate([(1.2, "ok"), (3.0, "ok"), (None, "incorrect"), (0.7, "ok")], start=2):
        ids[i], _ = store.add_candidate(TASK_A.id, code(i), "manual")
        verdict = ok(speedup) if status == "ok" else Verdict(status=status, device="cpu", reasons=["wrong"])
        store.record_verdict(ids[i], verdict)
    # A candidate whose latest verdict on the device is a failure is not correct.
    flaky, _ = store.add_candidate(TASK_A.id, code(9), "manual")
    store.record_verdict(flaky, ok(5.0), config_key="a")
    store.record_verdict(flaky, Verdict(status="incorrect", device="cpu"), config_key="b")
    found = store.correct_candidates(TASK_A.id, "cpu")
    assert [c.speedup for c in found] == [3.0, 1.2, 0.7]
    assert store.best_candidate(TASK_A.id, "cpu").candidate_id == ids[3]
    assert store.best_candidate(TASK_A.id, "NVIDIA H200") is None
    assert [c.speedup for c in store.correct_candidates(TASK_A.id, "cpu", config_key="a")] == [5.0]
    assert store.best_candidate(TASK_B.id) is None


def test_recent_failures_include_parse_errors(store):
    cid, _ = store.add_candidate(TASK_A.id, code(2), "manual")
    failing = Verdict(status="compile_error", device="cpu", reasons=["nvcc failed"], log="error: x undefined\n" * 500,
                      checks=[Check(name="compile", passed=False, detail="kernel.cu(3): error: identifier x")])
    store.record_verdict(cid, failing)
    time.sleep(0.01)
    prompt_id = store.record_prompt(TASK_A.id, [{"role": "user", "content": "go"}], exemplar_ids=[cid])
    store.record_completion(prompt_id, "no code here", model="m", parse_status="parse_error",
                            parse_message="no code block found")
    failures = store.recent_failures(TASK_A.id, n=5)
    assert [f.status for f in failures] == ["parse_error", "compile_error"]
    assert "kernel.cu(3)" in failures[1].message and len(failures[1].message) <= 2000
    assert failures[1].reasons == ["nvcc failed"]
    assert len(store.recent_failures(TASK_A.id, n=1)) == 1
    assert store.recent_failures(TASK_B.id) == []


def test_prompts_and_completions(store):
    run = store.start_run("opt", {"temperature": 0.7})
    cid, _ = store.add_candidate(TASK_A.id, code(2), "manual")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    prompt_id = store.record_prompt(TASK_A.id, messages, exemplar_ids=[cid], run_id=run)
    completion_id = store.record_completion(
        prompt_id, "```python\n...\n```", endpoint="http://localhost:8000/v1", model="m", prompt_tokens=100,
        completion_tokens=50, latency_s=1.5, cost=0.001, finish_reason="stop", candidate_id=cid,
    )
    assert store.prompt(prompt_id)["messages"] == messages
    assert store.prompt(prompt_id)["exemplar_ids"] == [cid]
    [row] = store.completions(prompt_id)
    assert row["id"] == completion_id and row["candidate_id"] == cid and row["task_id"] == TASK_A.id
    with pytest.raises(ValueError, match="unknown prompt"):
        store.record_completion(999, "x")
    with pytest.raises(sqlite3.IntegrityError):  # the candidate must exist for the prompt's task
        store.record_completion(prompt_id, "x", candidate_id="000000000000")


def test_reference_timing_cache(store):
    versions = {"torch": "2.13.0", "cuda": "12.8"}
    assert store.reference_timing(TASK_A.id, "cpu", versions) is None
    store.save_reference_timing(TASK_A.id, "cpu", versions, {"median_ms": 2.0})
    assert store.reference_timing(TASK_A.id, "cpu", dict(reversed(versions.items()))) == {"median_ms": 2.0}
    assert store.reference_timing(TASK_A.id, "cpu", {"torch": "2.14.0", "cuda": "12.8"}) is None
    assert store.reference_timing(TASK_A.id, "NVIDIA H200", versions) is None
    store.save_reference_timing(TASK_A.id, "cpu", versions, {"median_ms": 1.9})
    assert store.reference_timing(TASK_A.id, "cpu", versions) == {"median_ms": 1.9}


def test_correct_verdicts_keep_the_reference_timing_and_flag_a_disturbed_window(store):
    torch_a, torch_b = {"torch": "2.13.0", "cuda": "12.8"}, {"torch": "2.14.0", "cuda": "12.8"}

    def judged(i: int, reference_ms: float, versions: dict = torch_a, status: str = "ok"):
        cid, _ = store.add_candidate(TASK_A.id, code(500 + i), "manual")
        verdict = dataclasses.replace(ok(1.5), reference_ms=reference_ms, versions=versions, status=status)
        assert store.record_verdict(cid, verdict, device="cpu")
        return store.verdict_for(cid, "cpu").check("reference_stable")

    first = judged(0, 2.0)
    assert first.passed is None and "first reference timing" in first.detail and first.blocking is False
    assert judged(1, 2.1).passed is True  # +5%: a normal window
    assert judged(2, 1.95).passed is True
    slow = judged(3, 2.6)  # +30% against the median of 2.0, 2.1, 1.95
    assert slow.passed is False and "+30.0%" in slow.detail and "disturbed" in slow.detail
    assert judged(4, 2.0, status="incorrect") is None  # only correct verdicts carry a reference time
    stored = store.reference_timing(TASK_A.id, "cpu", torch_a)
    assert stored["samples_ms"] == [2.0, 2.1, 1.95, 2.6] and stored["median_ms"] == 2.1
    # New software versions start a new yardstick instead of being compared with the old one.
    assert judged(5, 4.0, versions=torch_b).passed is None
    assert store.reference_timing(TASK_A.id, "cpu", torch_b)["samples_ms"] == [4.0]
    # A verdict already on file changes nothing, not even the samples.
    cid, _ = store.add_candidate(TASK_A.id, code(500), "manual")
    assert not store.record_verdict(cid, dataclasses.replace(ok(1.5), reference_ms=9.0, versions=torch_a), device="cpu")
    assert store.reference_timing(TASK_A.id, "cpu", torch_a)["samples_ms"] == [2.0, 2.1, 1.95, 2.6]


def test_reference_stable_judges_a_median_against_the_kept_ones():
    first = reference_stable(2.0, {})
    assert first.name == "reference_stable" and first.passed is None and first.blocking is False
    assert reference_stable(2.0, {"median_ms": 2.0}).passed is None  # a median with no samples is no yardstick
    kept = {"median_ms": 2.0, "samples_ms": [1.9, 2.0, 2.1]}
    assert REFERENCE_DRIFT_LIMIT == 0.10
    assert reference_stable(2.18, kept).passed is True  # +9%: within the limit
    assert reference_stable(1.82, kept).passed is True  # -9%
    fast = reference_stable(1.7, kept)
    assert fast.passed is False and "-15.0%" in fast.detail and "3 earlier verdict(s)" in fast.detail


def test_run_results_resume_and_export(store, tmp_path):
    run = store.start_run("bench", {"tasks": 2})
    later = store.start_run("bench-2", {})
    a1, _ = store.add_candidate(TASK_A.id, code(2), {"kind": "strategy", "strategy": "eager"}, run)
    a2, _ = store.add_candidate(TASK_A.id, code(3), {"kind": "strategy", "strategy": "compile"}, run)
    b1, _ = store.add_candidate(TASK_B.id, code(4), {"kind": "strategy", "strategy": "eager"}, run)
    twin, _ = store.add_candidate(TASK_A.id, code(2, comment="# twin"), "manual", run)
    assert [c.candidate_id for c in store.unevaluated_candidates(run, "cpu")] == [a1, a2, b1, twin]
    store.record_verdict(a1, ok(1.1), run_id=run)
    store.record_verdict(a2, ok(2.2), run_id=run)
    # The twin normalises like a1, which now has a verdict: still its own to evaluate (exact source).
    assert [c.candidate_id for c in store.unevaluated_candidates(run, "cpu")] == [b1, twin]
    assert [c.candidate_id for c in store.unevaluated_candidates(run, "NVIDIA H200")] == [a1, a2, b1, twin]
    store.record_verdict(b1, Verdict(status="timeout", device="cpu", reasons=["too slow"]), run_id=run)
    store.record_verdict(twin, ok(1.0), run_id=run)
    assert store.unevaluated_candidates(run, "cpu") == []
    # A later run that meets a known candidate again lists it for its own resume.
    store.add_candidate(TASK_A.id, code(7), "manual", later)
    store.record_verdict(store.add_candidate(TASK_A.id, code(7), "manual", later)[0], ok(9.0), run_id=later)

    rows = store.run_results(run)
    assert [(r["task_name"], r["status"], r["speedup"]) for r in rows] == [
        ("3_Double", "ok", 1.1), ("3_Double", "ok", 2.2), ("Plus", "timeout", None), ("3_Double", "ok", 1.0)]
    assert rows[0]["origin"] == "eager" and rows[0]["origin_detail"]["kind"] == "strategy"
    assert rows[2]["reasons"] == ["too slow"] and rows[2]["verdict"]["status"] == "timeout"

    out = tmp_path / "solutions.jsonl"
    assert export_solutions_jsonl(store, out, run_id=run, device="cpu") == 1  # task B has no correct candidate
    record = json.loads(out.read_text())
    assert record["custom_code"] == code(3) and record["score_speedup"] == 2.2
    assert (record["level_id"], record["task_id"], record["task_name"]) == (1, 3, "3_Double")
    assert export_solutions_jsonl(store, out) == 1 and json.loads(out.read_text())["score_speedup"] == 9.0

    store.record_verdict(b1, ok(1.3, device="NVIDIA H200"), run_id=run)
    assert export_solutions_jsonl(store, out, run_id=run) == 2
    loaded = load_solutions_jsonl(out)  # the audit command's reader accepts it
    assert [r.task.id for r in loaded] == [TASK_A.id, TASK_B.id]
    assert loaded[1].record["task_id"] == 4  # unnumbered task: one past the level's highest number
    assert loaded[1].candidate == code(4) and loaded[1].claims == {"score_speedup": 1.3}


def test_threads_share_one_store(store):
    errors = []

    def work(worker: int) -> None:
        try:
            for i in range(40):
                cid, _ = store.add_candidate(TASK_A.id, code(1000 * worker + i), "manual")
                store.record_verdict(cid, ok(1.0 + i / 100))
                store.correct_candidates(TASK_A.id, "cpu")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store._read("SELECT COUNT(*) FROM verdicts")[0][0] == 160
    assert len(store.correct_candidates(TASK_A.id, "cpu")) == 160
    assert store.integrity_check() == "ok"


# -- crash safety: kill -9 a real writer at random moments ---------------------------------------------


def _writer_round(db: Path, total: int, rng: random.Random, mode: str) -> list[str]:
    """Run the writer; kill it with SIGKILL (mode 'startup' / 'loop') or let it finish ('finish')."""
    proc = subprocess.Popen([sys.executable, str(WRITER), str(db), str(total)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    # Loop kills land after a random number of this writer's own verdicts, not after a random time: a
    # fast disk can commit the whole run within any fixed sleep, and then no kill lands mid-run.
    kill_after = rng.randint(1, 12)
    seen_records = 0
    enough_records = threading.Event()
    any_record = threading.Event()

    def read() -> None:
        nonlocal seen_records
        for line in proc.stdout:
            if line.endswith("\n"):  # a line cut by the kill is not a claim
                lines.append(line.strip())
            if line.startswith("recorded"):
                seen_records += 1
                any_record.set()
            if seen_records >= kill_after or line.strip() == "done":  # a writer with nothing left says done
                enough_records.set()

    reader = threading.Thread(target=read)
    reader.start()
    if mode == "startup":
        # Anywhere from interpreter start to migration to the loop, but no later than the first verdict:
        # a fast writer would otherwise finish the whole run before a startup kill.
        any_record.wait(rng.uniform(0.0, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
    elif mode == "loop":
        assert enough_records.wait(30), proc.stderr.read() if proc.poll() is not None else "writer stalled"
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    reader.join(timeout=60)
    stderr = proc.stderr.read()
    proc.stderr.close()
    proc.stdout.close()
    if mode == "finish":
        assert proc.returncode == 0, stderr
    elif "done" in lines:  # a fast disk may let a writer finish before the kill lands (or just after)
        assert proc.returncode in (0, -signal.SIGKILL), stderr
    else:
        assert proc.returncode == -signal.SIGKILL, stderr
    return lines


@pytest.mark.slow
def test_kill_9_loses_nothing_and_resumes(tmp_path):
    db = tmp_path / "crash.db"
    total = 400
    rng = random.Random(20250718)
    claimed: dict[int, str] = {}
    loop_kills_mid_run = 0
    for mode in ["startup", "loop", "loop", "startup", "loop", "loop", "loop", "finish"]:
        lines = _writer_round(db, total, rng, mode)
        starts = [int(line.split()[1]) for line in lines if line.startswith("start")]
        firsts = [int(line.split()[1]) for line in lines if line.startswith("first")]
        recorded = [line.split() for line in lines if line.startswith("recorded")]
        if starts:
            # Nothing already claimed was lost: the DB holds at least every printed verdict.
            assert starts[0] >= len(claimed)
            if firsts:
                assert firsts[0] == starts[0]  # resumes exactly where the last commit left off
        for _, index, cid in recorded:
            assert int(index) not in claimed  # never recorded twice
            claimed[int(index)] = cid
        if mode == "loop" and recorded and "done" not in lines:
            loop_kills_mid_run += 1
        if db.exists():
            conn = sqlite3.connect(db)
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            migrated = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'verdicts'").fetchone()
            # A kill during the first open may leave a DB without tables; the next writer migrates it.
            stored = [row[0] for row in conn.execute("SELECT candidate_id FROM verdicts")] if migrated else []
            conn.close()
            assert len(stored) == len(set(stored))
            assert set(claimed.values()) <= set(stored)  # every verdict reported as recorded survived
    assert loop_kills_mid_run >= 3  # the kills really landed while verdicts were being written
    # A kill between a commit and its print leaves a verdict nobody claimed: at most one per kill.
    assert set(claimed) <= set(range(total)) and len(claimed) >= total - 7

    with Store(db, readonly=True) as s:
        assert s.integrity_check() == "ok"
        [run] = s.runs("kill-test")
        rows = s.run_results(run.id)
        assert len(rows) == total
        assert len({r["candidate_id"] for r in rows}) == total
        by_id = {r["candidate_id"]: r for r in rows}
        for index, cid in claimed.items():
            assert by_id[cid]["speedup"] == pytest.approx(1.0 + index / 1000)
        assert s._read("SELECT COUNT(*) FROM candidates")[0][0] == total
        assert s._read("SELECT COUNT(*) FROM run_candidates")[0][0] == total
        assert s.unevaluated_candidates(run.id, "cpu") == []


def test_normalised_hash_sees_what_the_compiler_runs():
    # A lone carriage return ends a line for compile() (so `R = 2` runs) but not for tokenize.
    assert norm_hash("R = 1\n# note\n") != norm_hash("R = 1\n# note\rR = 2\n")
    assert norm_hash("R = 1\r\nS = 2\r\n") == norm_hash("R = 1\nS = 2\n")  # line-end style alone is layout
    # Inside a string, line breaks and indentation are content.
    assert norm_hash('s = """\n"""\n') != norm_hash('s = """\n\n\n"""\n')
    assert norm_hash('exec("""a = 1\nif a:\n    b = 2\n""")\n') != norm_hash('exec("""a = 1\nif a:\nb = 2\n""")\n')
    cuda = 'src = """#define X \\\\\n\nint y;\n"""\n'
    assert norm_hash(cuda) != norm_hash(cuda.replace("\n\nint", "\nint"))
