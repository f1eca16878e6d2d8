"""`cuda-l1 eval REF CAND --json`: the verdict contract at the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CORPUS = Path(__file__).parent / "corpus"
REQUIRED = {"status", "speedup", "reference_ms", "candidate_ms", "ci", "checks", "reasons", "device", "versions"}


def run_eval(ref: Path, cand: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuda_l1", "eval", str(ref), str(cand), "--device", "cpu", *extra],
                          capture_output=True, text=True, timeout=300)


def test_json_verdict_ok_has_every_field():
    out = run_eval(CORPUS / "refs" / "relu_add.py", CORPUS / "cpu" / "output_aliases_input.py", "--json", "--quick")
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)
    assert REQUIRED <= set(verdict)
    assert verdict["status"] == "rejected" and verdict["speedup"] is None and verdict["reasons"]
    assert all({"name", "passed", "detail"} <= set(c) for c in verdict["checks"])
    assert verdict["versions"]["torch"]


def test_json_verdict_with_timing(tmp_path):
    cand = tmp_path / "cand.py"
    cand.write_text((CORPUS / "refs" / "relu_add.py").read_text().replace("class Model(", "class ModelNew("))
    out = run_eval(CORPUS / "refs" / "relu_add.py", cand, "--json", "--quick")
    verdict = json.loads(out.stdout)
    assert verdict["status"] == "ok" and verdict["speedup"] is not None
    assert verdict["ci"][0] <= verdict["raw_speedup"] <= verdict["ci"][1]
    assert verdict["reference_ms"] > 0 and verdict["candidate_ms"] > 0


def test_readable_summary_and_failed_verdict_exit_zero():
    out = run_eval(CORPUS / "refs" / "relu_add.py", CORPUS / "cpu" / "syntax_error.py")
    assert out.returncode == 0
    assert "compile_error" in out.stdout and "Traceback" not in out.stderr


def test_a_lone_surrogate_from_the_side_is_printed_as_a_verdict(tmp_path):
    """JSON lets a side send "\\ud800", which decodes to a str that no UTF-8 encoder takes: printing
    the verdict raised UnicodeEncodeError in the parent, a traceback and no verdict."""
    cand = tmp_path / "cand.py"
    cand.write_text('raise RuntimeError("bad \\ud800 text")\n')
    out = run_eval(CORPUS / "refs" / "relu_add.py", cand)
    assert out.returncode == 0 and "compile_error" in out.stdout, out.stderr
    assert "Traceback" not in out.stderr and "bad ? text" in out.stdout
    out = run_eval(CORPUS / "refs" / "relu_add.py", cand, "--json")
    verdict = json.loads(out.stdout)
    json.dumps(verdict, ensure_ascii=False).encode("utf-8")  # what the store and exports write


def test_broken_reference_is_bad_input(tmp_path):
    ref = tmp_path / "ref.py"
    ref.write_text("def get_inputs(:\n")
    out = run_eval(ref, CORPUS / "cpu" / "identical.py")
    assert out.returncode == 2 and "syntax error" in out.stderr and "Traceback" not in out.stderr
    out = run_eval(CORPUS / "refs" / "relu_add.py", tmp_path / "missing.py")
    assert out.returncode == 2 and "no such file" in out.stderr
    out = run_eval(tmp_path, CORPUS / "cpu" / "identical.py")
    assert out.returncode == 2 and "a directory, not a file" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("where,ending", [
    ("get_inputs", "os._exit(0)"),  # its own status, 0: the command ended "successfully", printing nothing
    ("forward", "os.kill(os.getpid(), signal.SIGKILL)"),  # in the reference's run before judging
])
def test_a_task_that_ends_its_process_is_bad_input_with_a_message(tmp_path, where, ending):
    """The task's own code runs in the pool's worker, not in the command's process: a task that ends
    or kills the process running it ended `eval` with no verdict and no message (status 0 for
    os._exit(0)). Now it is bad input: exit 2 and what happened."""
    source = (CORPUS / "refs" / "relu_add.py").read_text()
    ref = tmp_path / "ref.py"
    marker = "def get_inputs():\n" if where == "get_inputs" else "    def forward(self, x, y):\n"
    assert marker in source
    indent = " " * (4 if where == "get_inputs" else 8)
    ref.write_text("import os\nimport signal\n" + source.replace(marker, marker + f"{indent}{ending}\n"))
    out = run_eval(ref, CORPUS / "cpu" / "identical.py", "--json")
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "while running the task's own code" in out.stderr and "Traceback" not in out.stderr


def test_sources_too_deep_for_the_parser_are_judged_or_refused(tmp_path):
    """A chain of thousands of operators makes Python's parser raise RecursionError (MemoryError for
    100,000 unary minus signs): a candidate's is a compile_error verdict, a reference's bad input."""
    honest = (CORPUS / "refs" / "relu_add.py").read_text()
    deep = "\nDEEP = " + "+".join(["1"] * 5000) + "\n"
    cand, ref = tmp_path / "cand.py", tmp_path / "ref.py"
    cand.write_text(honest.replace("class Model(", "class ModelNew(") + deep)
    ref.write_text(honest + deep)
    out = run_eval(CORPUS / "refs" / "relu_add.py", cand, "--json", "--no-timing")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "compile_error"
    out = run_eval(ref, CORPUS / "cpu" / "identical.py")
    assert out.returncode == 2 and "nested too deeply" in out.stderr and "Traceback" not in out.stderr


def test_static_scan_never_raises_on_absurd_nesting():
    from cuda_l1.evaluate import static_scan

    for source in ("x = " + "+".join(["1"] * 5000), "x = " + "-" * 100_000 + "1", "x = " + "(" * 300 + ")" * 300):
        assert isinstance(static_scan.scan(source), dict)


def test_same_candidate_twice_same_status():
    from corpus_util import cases
    from cuda_l1.evaluate.config import EvalConfig
    from cuda_l1.evaluate.evaluator import Evaluator

    picked = {c.name: c for c in cases("cpu")}
    for name in ("pointer_cache", "input_mutation", "nan_output"):
        case = picked[name]
        config = EvalConfig(device="cpu")
        config.timing.enabled = False
        evaluator = Evaluator(case.task(), config)
        statuses = {evaluator.evaluate(case.source()).status for _ in range(2)}
        assert statuses == {case.expect}, name
