"""Task sources: loaders, filters, ids, and every kind of bad input (clear message, exit 2)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_l1.cli import app  # noqa: F401  (import check: the CLI assembles)
from cuda_l1.cli.app import run
from cuda_l1.errors import TaskError, UserError
from cuda_l1.tasks import (code_id, find_task, load_directory, load_solutions_jsonl, load_task_file, load_tasks,
                           parse_levels, source_id)
from cuda_l1.tasks.runtime import describe_task

GOOD = '''"""Doubles a tensor."""
import torch
import torch.nn as nn

N = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
'''


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def kb_dir(tmp_path):
    """A KernelBench-layout directory written for the tests."""
    root = tmp_path / "kb"
    write(root / "level1" / "1_Double.py", GOOD)
    write(root / "level1" / "19_ReLU.py", GOOD.replace("x * 2", "torch.relu(x)").replace("Doubles", "ReLU of"))
    write(root / "level2" / "3_Chain.py", GOOD.replace("x * 2", "torch.relu(x * 2) + 1").replace("Doubles", "Chain of"))
    write(root / "level3" / "7_Net.py", GOOD.replace("x * 2", "torch.tanh(x) * 3").replace("Doubles", "Net of"))
    return root


def test_builtin_suite_lists_36_tasks_over_3_levels():
    tasks = load_tasks("builtin")
    assert len(tasks) >= 36
    assert {t.level for t in tasks} == {1, 2, 3}
    assert all(sum(t.level == lv for t in tasks) >= 12 for lv in (1, 2, 3))


def test_kernelbench_directory_levels_and_ids(kb_dir):
    tasks = load_directory(kb_dir)
    assert [(t.level, t.name) for t in tasks] == [(1, "1_Double"), (1, "19_ReLU"), (2, "3_Chain"), (3, "7_Net")]
    assert tasks[1].number == 19 and tasks[1].description == "ReLU of a tensor."
    assert [t.name for t in load_tasks(str(kb_dir), levels={2, 3})] == ["3_Chain", "7_Net"]
    relu = tasks[1]
    assert find_task(tasks, "1/19") is relu
    assert find_task(tasks, "19_ReLU") is relu
    assert find_task(tasks, relu.id[:6]) is relu
    assert load_tasks(str(kb_dir), ids=["L2/3_Chain"])[0].name == "3_Chain"
    with pytest.raises(UserError, match="no task matches"):
        find_task(tasks, "1/99")


def test_id_is_a_stable_hash_of_the_source(tmp_path):
    a = load_task_file(write(tmp_path / "a.py", GOOD))
    b = load_task_file(write(tmp_path / "b.py", GOOD.replace("\n", "\r\n") + "\n\n"))
    c = load_task_file(write(tmp_path / "c.py", GOOD.replace("x * 2", "x * 3")))
    assert a.id == b.id != c.id and len(a.id) == 12


def test_a_candidate_id_is_of_the_exact_text():
    """Task ids forgive line ends and trailing whitespace; candidate ids do not (a `\\ ` line end is
    a syntax error where the stripped line continues)."""
    texts = [GOOD, GOOD.replace("\n", "\r\n"), GOOD.replace("x * 2\n", "x * 2 \n"), GOOD + "\n"]
    assert len({source_id(t) for t in texts}) == 1
    ids = [code_id(t) for t in texts]
    assert len(set(ids)) == len(texts) and all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
    assert code_id(GOOD) == hashlib.sha256(GOOD.encode("utf-8")).hexdigest()[:16]  # the bytes, as they are


def test_jsonl_solution_set_with_missing_candidates(tmp_path):
    lines = [
        {"level_id": 1, "task_id": 19, "ref_code": GOOD, "custom_code": GOOD.replace("class Model", "class ModelNew"),
         "score_default": 1.5},
        {"level_id": 2, "task_id": 3, "ref_code": GOOD, "custom_code": None},
        {"level_id": 2, "task_id": 4, "ref_code": GOOD, "custom_code": "None"},
    ]
    path = write(tmp_path / "s.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    records = load_solutions_jsonl(path)
    assert [r.candidate is None for r in records] == [False, True, True]
    assert records[0].claims == {"score_default": 1.5} and records[0].task.level == 1 and records[0].task.number == 19
    assert len(load_tasks(str(path))) == 1  # same reference code: one task


def test_names_a_task_source_gives_itself_print_as_one_plain_line(tmp_path, capsys):
    """A solution set's task_name, a file's name and a docstring's first line go into every progress line,
    table and report: control characters (NUL, newline, a terminal's escape codes) print as '?'."""
    evil = "9_Evil\x1b[2J\nname\x00" + "x" * 500
    doc = GOOD.replace('"""Doubles a tensor."""', '"""Doubles \x1b[31ma tensor."""')
    path = write(tmp_path / "s.jsonl", json.dumps({"level_id": 1, "task_id": 9, "ref_code": doc,
                                                   "custom_code": None, "task_name": evil}) + "\n")
    task = load_solutions_jsonl(path)[0].task
    assert task.name == "9_Evil?[2J?name?" + "x" * 239 and task.description == "Doubles ?[31ma tensor."
    assert task.id == load_solutions_jsonl(path)[0].task.id  # (the source, not the name, makes the id)
    named = load_task_file(write(tmp_path / "level1" / "3_a\nb.py", GOOD))
    assert named.name == "3_a?b" and named.number == 3
    from cuda_l1.bench import candidates_from_directory  # a candidate file is named as its task's file is

    write(tmp_path / "candidates" / "3_a\nb.py", GOOD.replace("class Model(", "class ModelNew("))
    [candidate] = candidates_from_directory(str(tmp_path / "candidates"), [named])
    assert candidate.task is named
    assert run(["tasks", "list", str(path)]) == 0
    assert "\x1b" not in capsys.readouterr().out


def test_describe_task_builds_inputs_without_running_forward(tmp_path):
    marker = tmp_path / "forward_ran"
    src = GOOD.replace("        return x * 2", f"        open({str(marker)!r}, 'w').close()\n        return x * 2")
    task = load_task_file(write(tmp_path / "t.py", src))
    info = describe_task(task)
    assert info["inputs"] == [{"shape": [64], "dtype": "float32"}]
    load_tasks(str(tmp_path / "t.py"))
    assert not marker.exists()


BAD_TASKS = {
    "syntax": ("class Model(:\n", "syntax error"),
    "no_model": (GOOD.replace("class Model(nn.Module)", "class Other(nn.Module)"), "missing Model"),
    "no_get_inputs": (GOOD.replace("def get_inputs", "def make_inputs"), "missing get_inputs"),
    "no_init": (GOOD.replace("def get_init_inputs", "def init_inputs"), "missing get_init_inputs"),
}


@pytest.mark.parametrize("case", sorted(BAD_TASKS))
def test_bad_task_files_name_the_file_and_the_problem(tmp_path, case, capsys):
    text, expected = BAD_TASKS[case]
    path = write(tmp_path / f"{case}.py", text)
    with pytest.raises(TaskError) as err:
        load_task_file(path)
    assert str(path) in str(err.value) and expected in str(err.value)
    assert run(["tasks", "list", str(path)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and expected in captured.err.replace("\n", " ")


def test_syntax_error_reports_the_line(tmp_path):
    path = write(tmp_path / "s.py", GOOD.replace("def get_inputs():", "def get_inputs(:"))
    with pytest.raises(TaskError, match=rf"{path}:\d+: syntax error"):
        load_task_file(path)


@pytest.mark.parametrize("returned", ["torch.randn(4)", "[object()]", "{'x': 1}"])
def test_get_inputs_must_return_tensors_and_scalars(tmp_path, returned, capsys):
    path = write(tmp_path / "t.py", GOOD.replace("return [torch.randn(N)]", f"return {returned}"))
    assert run(["tasks", "show", str(path), "t"]) == 2
    err = capsys.readouterr().err
    assert "get_inputs()" in err and str(path) in err.replace("\n", "") and "Traceback" not in err


def test_empty_directory_and_missing_paths(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert run(["tasks", "list", str(tmp_path / "empty")]) == 2
    assert "no tasks found" in capsys.readouterr().err
    assert run(["tasks", "list", str(tmp_path / "nowhere")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "line,expected",
    [("{not json", "not valid JSON"), ('{"level_id": 1, "task_id": 2, "ref_code": "x"}', "missing field(s) custom_code"),
     ('[1, 2]', "JSON object"), ('{"level_id": "a", "task_id": 2, "ref_code": "x", "custom_code": null}', "integers"),
     # each of these raised past the loader: OverflowError, ValueError, RecursionError, then SQLite's
     # OverflowError and UnicodeEncodeError when the record was stored
     ('{"level_id": 1e999, "task_id": 2, "ref_code": "x", "custom_code": null}', "integers"),
     ('{"level_id": 1.7, "task_id": 2, "ref_code": "x", "custom_code": null}', "integers"),
     ('{"level_id": %s, "task_id": 2, "ref_code": "x", "custom_code": null}' % ("9" * 5001), "not a JSON record"),
     ("[" * 100000 + "]" * 100000, "not a JSON record"),
     ('{"level_id": %d, "task_id": 2, "ref_code": "x", "custom_code": null}' % 10**30, "integers"),
     ('{"level_id": 1, "task_id": 2, "ref_code": "x", "custom_code": "y = 1  # \\ud800"}', "lone surrogate")],
)
def test_bad_jsonl_lines_name_file_and_line(tmp_path, line, expected, capsys):
    good = json.dumps({"level_id": 1, "task_id": 1, "ref_code": GOOD, "custom_code": None})
    path = write(tmp_path / "s.jsonl", good + "\n" + line + "\n")
    with pytest.raises(TaskError, match=rf"{path}:2: .*{expected.split('(')[0]}"):
        load_solutions_jsonl(path)
    assert run(["tasks", "list", str(path)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_levels_flag_validation():
    assert parse_levels("1,3") == {1, 3} and parse_levels(None) is None
    for text in ("one", ",,,"):  # ",,," meant every level
        with pytest.raises(UserError):
            parse_levels(text)


def test_cli_list_json_and_show():
    out = subprocess.run([sys.executable, "-m", "cuda_l1", "tasks", "list", "builtin", "--levels", "2", "--json"],
                         capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    assert len(rows) == 12 and all({"id", "name", "level"} <= set(r) and r["level"] == 2 for r in rows)
    out = subprocess.run([sys.executable, "-m", "cuda_l1", "tasks", "show", "builtin", "1/1", "--json"],
                         capture_output=True, text=True, check=True)
    shown = json.loads(out.stdout)
    assert shown["level"] == 1 and shown["inputs"] and "class Model" in shown["source"]


def test_every_command_has_help():
    for args in (["--help"], ["tasks", "--help"], ["tasks", "list", "--help"], ["eval", "--help"], ["bench", "--help"],
                 ["audit", "--help"], ["report", "--help"]):
        out = subprocess.run([sys.executable, "-m", "cuda_l1", *args], capture_output=True, text=True)
        assert out.returncode == 0 and "Usage" in out.stdout, args


def test_a_constant_nan_argument_is_one_fixed_signature():
    """NaN equals nothing, itself included: a task passing float('nan') as an argument was refused as
    changing its values from one seed to the next. (And an infinite scalar output made the identical
    candidate incorrect: inf - inf is NaN.)"""
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig
    from cuda_l1.evaluate.evaluator import evaluate
    from cuda_l1.tasks import make_task

    reference = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, fill):
        return torch.nan_to_num(x * fill, nan=1.0), float("inf")


def get_inputs():
    return [nn.Parameter(torch.randn(64)), float("nan")]  # an input is copied by value: a subclass is fine


def get_init_inputs():
    return []
'''
    candidate = reference.replace("class Model(", "class ModelNew(").split("def get_inputs")[0]
    verdict = evaluate(make_task(reference, name="nan_fill", level=1, origin="nan_fill.py"), candidate,
                       EvalConfig(device="cpu", timing=TimingConfig(enabled=False), correctness_trials=2))
    assert verdict.status == "ok", verdict.reasons


def test_a_lazily_conjugated_or_negated_input_is_copied_by_its_values():
    """Inputs are copied by value into the sides' slots; a lazily conjugated (or negated) input was
    accepted by the reference check and then failed every candidate's evaluation (a conjugate view
    cannot be viewed as bytes)."""
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig
    from cuda_l1.evaluate.evaluator import evaluate
    from cuda_l1.tasks import make_task

    reference = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, z, w):
        return (z * 2).imag + w


def get_inputs():
    z = torch.randn(64, dtype=torch.complex64)
    return [z.conj(), torch.randn(64)._neg_view()]


def get_init_inputs():
    return []
'''
    candidate = reference.replace("class Model(", "class ModelNew(").split("def get_inputs")[0]
    wrong = candidate.replace("(z * 2).imag", "(z.conj() * 2).imag")  # the conjugate of what it was given
    config = EvalConfig(device="cpu", timing=TimingConfig(enabled=False), correctness_trials=2)
    task = make_task(reference, name="conj_input", level=1, origin="conj_input.py")
    assert evaluate(task, candidate, config).status == "ok"
    assert evaluate(task, wrong, config).status == "incorrect"


def test_outputs_of_one_call_may_share_memory_where_the_references_do():
    """A reference returning two views of one tensor is matched by a candidate doing the same (the
    corpus's overlapping_outputs is refused: its reference's outputs are apart)."""
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig
    from cuda_l1.evaluate.evaluator import evaluate
    from cuda_l1.tasks import make_task

    reference = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        y = torch.tanh(x)
        return y, y[16:], y


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
'''
    candidate = reference.replace("class Model(", "class ModelNew(").split("def get_inputs")[0]
    config = EvalConfig(device="cpu", timing=TimingConfig(enabled=False), correctness_trials=2)
    verdict = evaluate(make_task(reference, name="views", level=1, origin="views.py"), candidate, config)
    assert verdict.status == "ok", verdict.reasons


@pytest.mark.parametrize("forward,refused", [
    ("return nn.functional.dropout(x * 2, 0.5, training=self.training)", "other outputs for the same inputs"),  # random
    ("self.calls += 1\n        return x * self.calls", "other outputs for the same inputs"),  # state kept between calls
    ("return nn.functional.dropout(x, 0.5, training=self.training).sum() * 0 + x.sum()", ""),  # never reaches the output
    ("return x.sum(0), int(x.numel())", ""),
    # Its inputs changed (said as such, not as random numbers); its second outputs, numpy arrays, could not be
    # compared (the comparison raised, and the task's fault became a candidate's runtime_error).
    ("x.add_(1.0)\n        return x * 2", "changes its inputs"),
    ("x.add_(1e-4)\n        return x * 2", "changes its inputs"),  # below a sample's tolerance: digested exactly
    ("x[7, 3] = 0.0\n        return x * 2", "changes its inputs"),  # one position
    ("x[:] = x.flip(0)\n        return x.sum()", "changes its inputs"),  # a permutation, sums unchanged
    ("self.calls += 1\n        import numpy\n        return x * 2 if self.calls == 1 else numpy.ones(3)",
     "raised on a second call"),
])
def test_a_reference_giving_other_outputs_for_the_same_inputs_is_refused(forward, refused):
    """Each call of a reference drawing random numbers draws its own (the float64 oracle's too), so its
    own error against the oracle was about its outputs' size and the allowance it scales let anything
    near pass. It is refused before any candidate is judged; --module-mode eval turns dropout off."""
    from cuda_l1.errors import TaskError
    from cuda_l1.tasks import make_task
    from cuda_l1.tasks.runtime import check_reference

    source = (
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.calls = 0\n\n    def forward(self, x):\n        " + forward +
        "\n\n\ndef get_inputs():\n    return [torch.randn(256, 64)]\n\n\ndef get_init_inputs():\n    return []\n")
    task = make_task(source, name="random", level=1, origin="random.py")
    if refused:
        with pytest.raises(TaskError, match=refused):
            check_reference(task)
    else:
        check_reference(task)
    if "dropout" in forward:
        check_reference(task, mode="eval")  # no dropout in eval mode
