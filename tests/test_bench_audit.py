"""`bench` and `audit` end to end on CPU: a resumable benchmark run and a published-set audit with a
missing candidate and an exploit."""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_l1.errors import UserError
from cuda_l1.store.verdict_file import read_verdicts
from cuda_l1.tasks import load_task_file

CORPUS = Path(__file__).parent / "corpus"
REF = (CORPUS / "refs" / "relu_add.py").read_text()


def cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuda_l1", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def kb_dir(tmp_path):
    root = tmp_path / "tasks" / "level1"
    root.mkdir(parents=True)
    (root / "1_ReluAdd.py").write_text(REF)
    (root / "2_Softmax.py").write_text((CORPUS / "refs" / "manual_softmax.py").read_text())
    return tmp_path / "tasks"


def test_bench_writes_report_and_resumes(kb_dir, tmp_path):
    out = tmp_path / "run"
    first = cli("bench", str(kb_dir), "--strategies", "eager,cudagraph", "--device", "cpu", "--quick",
                "--out", str(out), "--json")
    assert first.returncode == 0, first.stderr[-2000:]
    result = json.loads(first.stdout)
    assert result["counts"]["evaluated"] == 2 and any("cudagraph skipped" in n for n in result["notes"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["n_tasks"] == 2 and summary["overall"]["n_correct"] == 2
    assert "missing" in json.dumps(summary["rules"])
    # The eager strategy times each reference against itself: that is the run's noise check, with no
    # separate A/A check first (calibration.json).
    assert summary["noise"]["checked"] and summary["noise"]["eager"]["n"] == 2
    assert not (out / "calibration.json").exists()
    for name in ("results.csv", "report.html", "history.sqlite"):
        assert (out / name).stat().st_size > 0
    assert list(out.glob("*.png"))
    # Asked for by name, the A/A check runs in a run of eager too.
    again = cli("bench", str(kb_dir), "--strategies", "eager", "--device", "cpu", "--quick", "--out", str(out), "--json",
                "--calibrate")
    assert json.loads(again.stdout)["counts"] == {"total": 2, "skipped": 2, "evaluated": 0, "reused": 0, "rejudged": 0,
                                                  "imported": 0, "broken_tasks": {}}
    assert json.loads((out / "calibration.json").read_text())["checks"][0]["n"] == 2
    # Verdicts the user no longer trusts are judged again on request, and say what they replaced.
    redo = cli("bench", str(kb_dir), "--strategies", "eager", "--device", "cpu", "--quick", "--out", str(out),
               "--json", "--no-calibrate", "--rejudge", "ok")
    assert redo.returncode == 0, redo.stderr[-2000:]
    assert json.loads(redo.stdout)["counts"] == {"total": 2, "skipped": 0, "evaluated": 2, "reused": 0, "rejudged": 2,
                                                 "imported": 0, "broken_tasks": {}}
    with sqlite3.connect(out / "history.sqlite") as conn:
        stored = [json.loads(v) for (v,) in conn.execute("SELECT verdict FROM verdicts")]
    assert sorted(v["timing"]["replaced"]["status"] for v in stored) == ["ok", "ok"]
    assert all(v["timing"]["replaced"]["why"] == "--rejudge ok" and v["attempts"] == 1 for v in stored)
    typo = cli("bench", str(kb_dir), "--device", "cpu", "--out", str(out), "--rejudge", "runtime-error")
    assert typo.returncode == 2 and "unknown status runtime-error" in typo.stderr and "Traceback" not in typo.stderr
    rebuilt = cli("report", str(out))
    assert rebuilt.returncode == 0 and "report" in rebuilt.stdout


def test_audit_reports_claims_missing_and_exploits(tmp_path):
    honest = REF.replace("class Model(", "class ModelNew(")
    exploit = (CORPUS / "cpu" / "input_mutation.py").read_text()
    records = [
        {"level_id": 1, "task_id": 1, "ref_code": REF, "custom_code": honest, "score_default": 1.0},
        {"level_id": 1, "task_id": 2, "ref_code": REF.replace("1 << 20", "1 << 19"), "custom_code": exploit,
         "score_default": 3.5},
        {"level_id": 1, "task_id": 3, "ref_code": REF.replace("1 << 20", "1 << 18"), "custom_code": None,
         "score_default": 2.0},
        # a record whose reference does not run here: not judged, counted, and the others still are
        {"level_id": 1, "task_id": 4, "ref_code": REF.replace("return torch.relu(x) + y", 'raise ValueError("ref broke")'),
         "custom_code": honest, "score_default": 2.0},
    ]
    path = tmp_path / "solutions.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    out = tmp_path / "audit"
    proc = cli("audit", str(path), "--device", "cpu", "--quick", "--out", str(out), "--json")
    assert proc.returncode == 2 and "1 task(s) not judged" in proc.stderr and "ref broke" in proc.stderr, \
        proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    totals = json.loads(proc.stdout)["totals"]
    assert totals["exploit"] == 1 and totals["missing"] == 1 and totals["holds"] + totals["shrinks"] == 1
    assert totals["task_broken"] == 1 and totals["records"] == 4
    audit = json.loads((out / "audit.json").read_text())
    by_task = {t["task"]: t for t in audit["tasks"]}
    assert by_task[2]["status"] == "rejected" and "inputs_unchanged" in by_task[2]["failed_checks"]
    assert by_task[2]["claimed"] == 3.5 and by_task[2]["measured"] is None
    assert by_task[3]["outcome"] == "missing"
    assert by_task[4]["outcome"] == "task_broken" and "ref broke" in by_task[4]["reasons"][0]
    assert "Audit: claimed vs measured" in (out / "report.html").read_text()
    # The honest record was timed only until its claim was decided (0.9 x 1.0), not to a 2% interval.
    with sqlite3.connect(out / "history.sqlite") as db:
        timings = [json.loads(v)["timing"] for (v,) in db.execute("SELECT verdict FROM verdicts WHERE status = 'ok'")]
    assert [t.get("thresholds") for t in timings] == [[0.9]]


def test_audit_refuses_a_non_jsonl_file(tmp_path):
    proc = cli("audit", str(tmp_path / "x.txt"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_audit_of_a_level_the_file_does_not_have_is_bad_input(tmp_path):
    path = tmp_path / "solutions.jsonl"
    path.write_text(json.dumps({"level_id": 1, "task_id": 1, "ref_code": REF, "custom_code": None}) + "\n")
    proc = cli("audit", str(path), "--device", "cpu", "--levels", "3", "--out", str(tmp_path / "audit"))
    assert proc.returncode == 2 and "the levels here are 1." in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "audit" / "audit.json").exists()


def test_audit_outcomes_and_decision_points():
    from cuda_l1.audit import decision_points, outcome
    from cuda_l1.evaluate.verdict import Check, Verdict

    def ok(speedup, *checks):
        return Verdict(status="ok", speedup=speedup, checks=list(checks))

    assert outcome(ok(1.9), 2.0, 0.9) == "holds" and outcome(ok(1.7), 2.0, 0.9) == "shrinks"
    assert outcome(ok(1.0, Check("timing_resolved", False, "not measured", blocking=False)), 1.05, 0.9) == "unmeasured"
    assert outcome(ok(1.0, Check("timing_resolved", True, "", blocking=False)), 1.05, 0.9) == "holds"
    assert outcome(Verdict(status="rejected"), 3.0, 0.9) == "exploit"
    assert outcome(Verdict(status="incorrect"), 3.0, 0.9) == "fails" and outcome(None, 3.0, 0.9) == "missing"
    assert decision_points({"score_default": 2.0}, 0.9) == (1.8,)
    assert decision_points({}, 0.9) == () and decision_points({"score_default": float("nan")}, 0.9) == ()


def test_a_claim_that_is_no_speedup_leaves_the_record_unclaimed():
    # A solutions file is input: a claim of 10**400 raised OverflowError out of the audit; -3 and 0 were
    # counted as "holds", NaN and infinity as "shrinks".
    from cuda_l1.audit import claimed_speedup, decision_points

    for bad in (10**400, -3, 0, float("nan"), float("inf"), -float("inf")):
        assert claimed_speedup({"score_speedup": bad}) is None and decision_points({"score_speedup": bad}, 0.9) == ()
    assert claimed_speedup({"score_speedup": "2.5x", "speedup": 2}) == 2.0  # the first numeric field
    assert claimed_speedup({"zeta": 3, "alpha": True}) == 3.0 and claimed_speedup({"speedup": 1.5}) == 1.5


def test_a_broken_reference_found_by_a_worker_leaves_its_task_unjudged_and_the_run_goes_on(kb_dir, tmp_path,
                                                                                         monkeypatch):
    """The caller runs no reference before judging: a KernelBench run spent 70-95 s of each call on an
    H200 doing so, 225 references in a row. The worker that prepares a task runs its reference once
    before judging any candidate of it. A broken one is bad input, named with its file and line, but
    one task must not stop a run of 250: its candidates get no verdict (no candidate is blamed for its
    task), the tasks after it are judged, and the report and summary.json say which was left out."""
    import cuda_l1.bench as bench
    import cuda_l1.tasks.runtime as runtime
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig

    ran_here: list[str] = []
    monkeypatch.setattr(runtime, "check_reference", lambda task, *rest: ran_here.append(task.key))
    (kb_dir / "level1" / "3_Broken.py").write_text(REF.replace("return torch.relu(x) + y",
                                                               'raise ValueError("forward broke")'))
    (kb_dir / "level1" / "4_After.py").write_text(REF + "\n# the task after the broken one\n")
    out = tmp_path / "run"
    config = EvalConfig(device="cpu", timing=TimingConfig.quick())
    result = bench.run_bench(str(kb_dir), str(out), strategies=["eager"], levels=None, device="cpu", config=config,
                             progress=False, workers=1)
    [(task_id, broken)] = result["counts"]["broken_tasks"].items()
    assert broken["task"] == "L1/3_Broken" and task_id == load_task_file(kb_dir / "level1" / "3_Broken.py").id
    assert "3_Broken.py" in broken["why"] and "line 13" in broken["why"] and "forward broke" in broken["why"]
    assert ran_here == []
    with sqlite3.connect(out / "history.sqlite") as conn:
        judged = dict(conn.execute("SELECT t.name, v.status FROM verdicts v JOIN tasks t ON t.id = v.task_id"))
    assert judged == {"1_ReluAdd": "ok", "2_Softmax": "ok", "4_After": "ok"}
    assert len(read_verdicts(out / "verdicts.jsonl")) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["n_tasks"] == 3 and [t["task"] for t in summary["tasks_not_run"]] == ["L1/3_Broken"]
    assert "Not judged" in (out / "report.html").read_text()


def test_bench_with_a_broken_task_prints_its_results_then_exits_2(kb_dir, tmp_path):
    """Through the command line: the other tasks' table and report first, then one paragraph naming the
    task and why (exit 2, bad input, no traceback); the same command again judges only that task."""
    (kb_dir / "level1" / "3_Broken.py").write_text(REF.replace("return torch.relu(x) + y",
                                                               'raise ValueError("forward broke")'))
    out = tmp_path / "run"
    args = ("bench", str(kb_dir), "--strategies", "eager", "--device", "cpu", "--quick", "--no-calibrate",
            "--out", str(out))
    first = cli(*args)
    assert first.returncode == 2, first.stderr[-2000:]
    assert "speedup of the best candidate per task" in first.stdout and "report:" in first.stdout
    assert "1 task(s) not judged" in first.stderr and "forward broke" in first.stderr, first.stderr[-2000:]
    assert "Traceback" not in first.stderr
    again = cli(*args)
    assert again.returncode == 2 and "0 evaluated, 2 already done" in again.stdout, again.stdout[-2000:]
    assert "1 task(s) not judged" in again.stderr
    # The report rebuilt from the store names it as the run's own did (it was left out silently).
    (out / "summary.json").unlink()
    rebuilt = cli("report", str(out))
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    assert [t["task"] for t in json.loads((out / "summary.json").read_text())["tasks_not_run"]] == ["L1/3_Broken"]
    assert "Not judged" in (out / "report.html").read_text()


def test_a_task_judged_when_its_run_resumes_is_no_longer_listed_as_not_run(kb_dir, tmp_path):
    """A resumed run keeps its run id: what it noted of a task whose reference failed (a file it reads
    was missing) must go once the task is judged, or a report rebuilt from the store dropped its verdict."""
    needed = tmp_path / "needed.txt"
    (kb_dir / "level1" / "3_Flaky.py").write_text(REF.replace(
        "def get_inputs():", f"def get_inputs():\n    open({str(needed)!r}).read()\n    return _inputs()\n\n\ndef _inputs():"))
    out = tmp_path / "run"
    args = ("bench", str(kb_dir), "--strategies", "eager", "--device", "cpu", "--quick", "--no-calibrate",
            "--out", str(out))
    assert cli(*args).returncode == 2
    needed.write_text("1")
    resumed = cli(*args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "tasks_not_run" not in json.loads((out / "summary.json").read_text())
    assert cli("report", str(out)).returncode == 0
    summary = json.loads((out / "summary.json").read_text())
    assert "tasks_not_run" not in summary and summary["overall"]["n_tasks"] == 3


def test_a_task_broken_on_a_later_run_shows_no_older_verdict_of_it(tmp_path):
    """Audited once, then again with --rejudge ok after its reference stopped running here: the record
    is task_broken, not the first run's `holds`, and neither summary.json nor the report counts that
    verdict (it said "in no figure above" beside a figure that held it)."""
    needed = tmp_path / "needed.txt"
    needed.write_text("1")
    ref = REF.replace("def get_inputs():", f"def get_inputs():\n    open({str(needed)!r}).read()\n    return _inputs()\n\n\n"
                                           "def _inputs():")
    path = tmp_path / "solutions.jsonl"
    path.write_text(json.dumps({"level_id": 1, "task_id": 7, "ref_code": ref,
                                "custom_code": ref.replace("class Model(", "class ModelNew("), "score_default": 1.0}) + "\n")
    out = tmp_path / "audit"
    args = ("audit", str(path), "--device", "cpu", "--quick", "--out", str(out), "--json")
    first = cli(*args)
    assert first.returncode == 0 and json.loads(first.stdout)["totals"]["holds"] == 1, first.stderr[-2000:]
    needed.unlink()
    second = cli(*args, "--rejudge", "ok")
    assert second.returncode == 2 and "1 task(s) not judged" in second.stderr, second.stderr[-2000:]
    totals = json.loads(second.stdout)["totals"]
    assert totals["task_broken"] == 1 and totals["holds"] == 0
    [row] = json.loads((out / "audit.json").read_text())["tasks"]
    assert row["outcome"] == "task_broken" and row["measured"] is None
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["n_correct"] == 0 and [t["task"] for t in summary["tasks_not_run"]] == ["L1/7"]


def test_the_noise_check_of_a_run_leaves_a_broken_task_to_the_run(kb_dir, tmp_path):
    """A folder of candidates runs the A/A noise check on a few of its tasks first: a broken one among
    them ended the run before any verdict. The check takes tasks whose reference runs; the run judges
    the others and names the broken one, as without the check."""
    (kb_dir / "level1" / "0_Broken.py").write_text(REF.replace("return torch.relu(x) + y",
                                                               'raise ValueError("forward broke")'))
    candidates = tmp_path / "candidates"
    candidates.mkdir()
    for name in ("0_Broken", "1_ReluAdd"):
        (candidates / f"{name}.py").write_text(REF.replace("class Model(", "class ModelNew("))
    out = tmp_path / "run"
    proc = cli("bench", str(candidates), "--tasks", str(kb_dir), "--device", "cpu", "--quick", "--out", str(out))
    assert proc.returncode == 2 and "1 task(s) not judged" in proc.stderr and "forward broke" in proc.stderr, \
        proc.stderr[-3000:]
    assert "noise check" in proc.stderr and (out / "calibration.json").is_file()
    with sqlite3.connect(out / "history.sqlite") as conn:
        judged = dict(conn.execute("SELECT t.name, v.status FROM verdicts v JOIN tasks t ON t.id = v.task_id"))
    assert judged == {"1_ReluAdd": "ok"}


def test_a_reference_that_cannot_run_in_the_sandbox_fails_its_task_only(kb_dir, tmp_path):
    """A reference that runs in the caller's process but not in a side (it reads a file outside the
    sandbox's reach) may fail beside another candidate on a GPU, so it is a verdict on its task's
    candidates, saying why, never the end of the run; and its failed eager candidate is that task's
    failure, not a sign that the host is too noisy to measure."""
    from cuda_l1.evaluate.confine import landlock_abi

    if landlock_abi() < 1:
        pytest.skip("needs Landlock: without it the side can read the file")
    outside = tmp_path / "scale.txt"
    outside.write_text("1.5")
    (kb_dir / "level1" / "3_ReadsOutside.py").write_text(REF.replace(
        "return torch.relu(x) + y", f"return (torch.relu(x) + y) * float(open({str(outside)!r}).read())"))
    out = tmp_path / "run"
    run = cli("bench", str(kb_dir), "--strategies", "eager", "--device", "cpu", "--quick", "--out", str(out), "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    with sqlite3.connect(out / "history.sqlite") as conn:
        judged = {name: json.loads(v) for name, v in
                  conn.execute("SELECT t.name, v.verdict FROM verdicts v JOIN tasks t ON t.id = v.task_id")}
    assert {name: v["status"] for name, v in judged.items()} == {"1_ReluAdd": "ok", "2_Softmax": "ok",
                                                                 "3_ReadsOutside": "runtime_error"}
    assert "Permission denied" in json.dumps(judged["3_ReadsOutside"])
    eager = json.loads((out / "summary.json").read_text())["noise"]["eager"]
    # (Whether the two ok ones came out within the band is this host's noise, not asked here.)
    assert eager["n_failed"] == 1 and not any("did not come out ok" in r for r in eager["reasons"]), eager


def test_a_run_resumes_from_its_verdicts_file_alone(kb_dir, tmp_path):
    """verdicts.jsonl carries ids and numbers, never code, and a fresh run directory over the same tasks
    takes its verdicts instead of judging again: a long run survives the loss of its store."""
    first = tmp_path / "first"
    run = cli("bench", str(kb_dir), "--strategies", "eager", "--device", "cpu", "--quick", "--no-calibrate",
              "--out", str(first), "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    lines = (first / "verdicts.jsonl").read_text().splitlines()
    assert len(lines) == 2
    text = "\n".join(lines)
    assert "torch.relu" not in text and "class Model" not in text and "def forward" not in text
    before = json.loads((first / "summary.json").read_text())["overall"]

    second = tmp_path / "second"
    again = cli("bench", str(kb_dir), "--strategies", "eager", "--device", "cpu", "--quick", "--no-calibrate",
                "--out", str(second), "--json", "--verdicts-from", str(first / "verdicts.jsonl"))
    assert again.returncode == 0, again.stderr[-2000:]
    counts = json.loads(again.stdout)["counts"]
    assert counts["imported"] == 2 and counts["evaluated"] == 0 and counts["skipped"] == 0
    after = json.loads((second / "summary.json").read_text())["overall"]
    assert after["n_correct"] == before["n_correct"] == 2 and after["speedup"] == before["speedup"]
    with sqlite3.connect(second / "history.sqlite") as conn:
        stored = [json.loads(v) for (v,) in conn.execute("SELECT verdict FROM verdicts")]
    assert all(any(c["name"] == "imported" and c["detail"] == "from verdicts.jsonl" for c in v["checks"])
               for v in stored)
    # Other settings are another measurement: nothing is taken, both are judged.
    full = cli("bench", str(kb_dir), "--strategies", "eager", "--device", "cpu", "--quick", "--no-calibrate",
               "--tolerance", "kernelbench", "--limit", "1", "--out", str(tmp_path / "third"), "--json",
               "--verdicts-from", str(first / "verdicts.jsonl"))
    assert full.returncode == 0, full.stderr[-2000:]
    assert json.loads(full.stdout)["counts"]["imported"] == 0 and json.loads(full.stdout)["counts"]["evaluated"] == 1
    # What a run was given and did not use is still in its file: keeping only the newest file loses nothing.
    assert len((tmp_path / "third" / "verdicts.jsonl").read_text().splitlines()) == 3
    rebuilt = cli("report", str(tmp_path / "third"))
    assert rebuilt.returncode == 0 and "verdicts.jsonl(3)" in "".join(rebuilt.stdout.split())
    assert (tmp_path / "third" / "verdicts.jsonl").stat().st_mode & 0o777 == 0o644  # a file to keep and share
    # A broken file in the run directory is set aside, not in the way of the report, and not lost.
    (tmp_path / "third" / "verdicts.jsonl").write_text("not json\n")
    again = cli("report", str(tmp_path / "third"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert (tmp_path / "third" / "verdicts.jsonl.unreadable").read_text() == "not json\n"
    # A verdict reopened by --rejudge is judged again, not filled from the file.
    redo = cli("bench", str(kb_dir), "--strategies", "eager", "--device", "cpu", "--quick", "--no-calibrate",
               "--out", str(second), "--json", "--rejudge", "ok", "--limit", "1")
    assert json.loads(redo.stdout)["counts"]["rejudged"] == 1



def test_a_gzipped_verdicts_file_reads_as_the_plain_one(tmp_path):
    """A thousand KernelBench verdicts are ~7 MB of text: a `.gz` copy is what a results repository keeps,
    and it resumes a run the same; a truncated or foreign one is bad input, not a traceback."""
    plain = tmp_path / "verdicts.jsonl"
    records = [(_RECORD % '{"status": "ok", "speedup": %s, "raw_speedup": %s, "reference_ms": 2.0, "candidate_ms": 1.0, '
                '"ci": [1.0, 2.0]}' % (v, v)).replace('"b"', f'"b{v}"')
               for v in (1.5, 2.5)]
    plain.write_text("\n".join(records) + "\n")
    packed = tmp_path / "verdicts.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    want, got = read_verdicts(plain, mark=False), read_verdicts(packed, mark=False)
    assert len(got) == 2 and {k: v.to_dict() for k, v in got.items()} == {k: v.to_dict() for k, v in want.items()}
    for broken in (gzip.compress(plain.read_bytes())[:30], plain.read_bytes()):
        packed.write_bytes(broken)
        with pytest.raises(UserError, match="cannot read the verdicts file"):
            read_verdicts(packed)

_RECORD = '{"task_id": "a", "candidate_id": "b", "device": "cpu", "config_key": "k", "verdict": %s}'


def test_an_ok_verdict_without_numbers_reads_only_when_timing_was_disabled(tmp_path):
    from cuda_l1.evaluate.verdict import CORRECTNESS_ONLY

    untimed = tmp_path / "verdicts.jsonl"
    untimed.write_text(_RECORD % json.dumps({"status": "ok", "timing": {"protocol": CORRECTNESS_ONLY}}) + "\n")
    assert [v.status for v in read_verdicts(untimed).values()] == ["ok"]
    untimed.write_text(_RECORD % json.dumps({"status": "ok", "timing": {"protocol": "rounds"}}) + "\n")
    with pytest.raises(UserError, match="an ok verdict without speedup, raw_speedup, reference_ms, candidate_ms"):
        read_verdicts(untimed)


@pytest.mark.parametrize("line", [
    "not json", '{"task_id": "a"}', "[" * 100000 + "]" * 100000, _RECORD % "5",
    _RECORD % '{"status": "ok", "speedup": "fast"}', _RECORD % '{"status": "ok", "ci": 5}',
    _RECORD % '{"status": "ok", "ci": ["a", "b"]}', _RECORD % '{"status": "ok", "reasons": 5}',
    _RECORD % '{"status": "ok", "device": 7}', _RECORD % '{"status": "ok", "task_id": "another"}',
    _RECORD % '{"status": "ok", "checks": [{"name": 1, "passed": true}]}', _RECORD % '{"status": "ok", "timing": []}',
    _RECORD % '{"status": "ok", "reasons": ["x \\ud800"]}',  # an escaped lone surrogate: a line of ASCII
    _RECORD % '{"status": "ok", "checks": [{"name": "x"}]}', _RECORD % '{"speedup": 2}',
    _RECORD % '{"status": "ok"}',  # a timed ok verdict with no numbers: a report would count it correct, unmeasured
    _RECORD % '{"status": "ok", "speedup": 0, "raw_speedup": 1, "reference_ms": 1, "candidate_ms": 1}',
], ids=lambda line: line[-60:])
def test_a_malformed_verdicts_file_is_bad_input(kb_dir, tmp_path, line):
    """Every field a report or the store reads is checked before any work: a bad value stored first
    broke the report afterwards, and every later resume of the directory."""
    bad = tmp_path / "verdicts.jsonl"
    bad.write_text(line + "\n")
    result = cli("bench", str(kb_dir), "--strategies", "eager", "--device", "cpu", "--quick", "--no-calibrate",
                 "--out", str(tmp_path / "run"), "--verdicts-from", str(bad))
    assert result.returncode == 2 and "line 1 is not a verdict record" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run" / "history.sqlite").exists()
    assert "__init__" not in result.stderr  # words for the user, not Python's


def test_one_command_at_a_time_in_a_run_directory(tmp_path):
    # Two commands on one --out both ran, judged the same programs twice, disturbed each other's timings and
    # wrote to one store. The second is now refused at once; the lock goes with the first's end.
    from cuda_l1.bench import RunContext

    first = RunContext(tmp_path / "run", "bench", {})
    try:
        with pytest.raises(UserError, match=rf"another cuda-l1 command \(process {os.getpid()}\) is writing"):
            RunContext(tmp_path / "run", "audit", {})
        task = tmp_path / "t.py"
        task.write_text(REF)
        proc = cli("bench", str(task), "--device", "cpu", "--strategies", "eager", "--no-calibrate",
                   "--out", str(tmp_path / "run"))
        assert proc.returncode == 2 and "is writing to the run directory" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    finally:
        first.close()
    again = RunContext(tmp_path / "run", "audit", {})  # let go: the next one runs
    again.close()


def test_an_emptied_store_does_not_let_a_run_write_over_its_verdicts(tmp_path):
    # A 0-byte history store opens as a new one: the run started there wrote its verdicts over the old file.
    from cuda_l1.bench import STORE_NAME, RunContext

    run = tmp_path / "run"
    run.mkdir()
    (run / "verdicts.jsonl").write_text('{"candidate_id": "x"}\n')
    (run / STORE_NAME).write_bytes(b"")
    with pytest.raises(UserError, match="holds no run") as caught:
        RunContext(run, "bench", {})
    assert "--verdicts-from" in str(caught.value)
    assert (run / "verdicts.jsonl").read_text() == '{"candidate_id": "x"}\n'
    (run / "verdicts.jsonl").unlink()
    RunContext(run, "bench", {}).close()  # the refused one let its lock go: a later command runs
