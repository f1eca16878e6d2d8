"""What a user sees when something is wrong: one paragraph, the right exit code, never a traceback.

Every case runs the real `cuda-l1` command in a subprocess, so typer's own handling of exceptions (which
an in-process runner hides) is part of what is tested. Usage errors and bad input exit 2; a run that
could not do its work exits 1.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chat_server import ChatServer, Reply

GOOD_TASK = textwrap.dedent('''
    """Doubles the input (a [h', c'] pair in spirit)."""
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, x):
            return x * 2


    def get_inputs():
        return [torch.randn(64)]


    def get_init_inputs():
        return []
''')

CANDIDATE = textwrap.dedent('''
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            return x * 2
''')


def cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "cuda_l1", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def assert_one_paragraph(proc: subprocess.CompletedProcess, code: int, *needles: str,
                         after_progress: bool = False) -> None:
    """The error is one paragraph, alone on stderr (`after_progress`: the last thing on it, after the
    progress lines of work done before it)."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == code, text
    assert "Traceback" not in text, text
    error = proc.stderr[proc.stderr.rfind("error:"):] if after_progress else proc.stderr
    assert error.startswith("error:"), text
    assert "\n\n" not in error.strip(), text  # one paragraph
    assert len(error.strip().splitlines()) <= 4, text  # soft-wrapped at most
    for needle in needles:
        assert needle in text, (needle, text)


ESCAPES = {  # what a task's code raised that got past the handlers and ended the worker judging it
    "keyboard_interrupt": "",  # KeyboardInterrupt itself: a worker ignores SIGINT, so it is the task's
    "interrupt_subclass": "class Stop(KeyboardInterrupt):\n    pass\n",
    "lying_class": "class Stop(BaseException):\n    @property\n    def __class__(self):\n"
                   "        return KeyboardInterrupt\n",
    "str_exits": "class Stop(Exception):\n    def __str__(self):\n        raise SystemExit(3)\n",
    "tensor_subclass": "class Stop(BaseException):\n    pass\n\n\nclass Odd(torch.Tensor):\n    @classmethod\n"
                       "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
                       "        if getattr(getattr(func, '__self__', None), '__name__', '') == 'layout':\n"
                       "            raise Stop()\n"
                       "        return super().__torch_function__(func, types, args, kwargs or {})\n",
}


@pytest.mark.parametrize("how", sorted(ESCAPES))
def test_what_a_tasks_code_raises_past_every_handler_is_its_failure_not_a_dead_worker(how, tmp_path):
    """A worker that died of its task's exception blamed its candidate ("the evaluation worker died 2
    times"), a settled runtime_error, and the task was never named. By exact type, with words read
    safely, and whatever escapes the task's code whole: the task is not judged (exit 2)."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    stop = "KeyboardInterrupt()" if how == "keyboard_interrupt" else "Stop()"
    body = ("return [torch.randn(64).as_subclass(Odd)]" if how == "tensor_subclass" else f"raise {stop}")
    (folder / "1_odd.py").write_text(GOOD_TASK.replace("import torch.nn as nn", "import torch.nn as nn\n\n\n"
                                                       + ESCAPES[how], 1).replace("return [torch.randn(64)]", body))
    proc = cli("bench", str(folder), "--device", "cpu", "--strategies", "eager", "--no-calibrate",
               "--out", str(tmp_path / "run"))
    assert_one_paragraph(proc, 2, "1_odd.py", "1 task(s) not judged", after_progress=True)
    assert "worker died" not in proc.stdout + proc.stderr
    with sqlite3.connect(tmp_path / "run" / "history.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0] == 0  # no candidate blamed


@pytest.mark.parametrize("args, needle", [
    (["bogus"], "No such command 'bogus'"),
    (["eval"], "Missing argument 'REFERENCE'"),
    (["eval", "--bogus-flag"], "--bogus-flag"),
    (["bench", "--workers", "notanint"], "--workers"),
    (["tasks", "list", "builtin", "--levels", "x"], "--levels takes comma-separated integers"),
    (["eval", "ref.py", "cand.py", "--timeout", "0"], "--timeout"),
])
def test_usage_errors_exit_2_in_one_paragraph(args, needle, tmp_path):
    proc = cli(*args, cwd=tmp_path)
    assert_one_paragraph(proc, 2, needle)
    if args[0] != "tasks":
        assert "--help" in proc.stderr  # where to look next


@pytest.mark.parametrize("args, needle", [
    (["audit", "set.jsonl", "--hold", "nan"], "--hold takes a fraction"),
    (["audit", "set.jsonl", "--hold", "-1"], "--hold takes a fraction"),  # every claim held
    (["optimize", "builtin", "--base-url", "http://host:abc/v1", "--model", "m"], "not a usable URL"),  # a traceback
    # --tasks with a task source was silently ignored; a missing one was blamed on SOURCE
    (["bench", "builtin", "--tasks", "builtin", "--strategies", "eager"], "--tasks goes with a directory"),
    (["bench", "set.jsonl", "--tasks", "builtin"], "--tasks goes with a directory"),
    (["bench", ".", "--tasks", "nosuch", "--strategies", "eager"], "--tasks nosuch: no such file"),
])
def test_values_out_of_range_are_bad_input(args, needle, tmp_path):
    assert_one_paragraph(cli(*args, cwd=tmp_path), 2, needle)


def test_help_and_version_exit_0_without_type_placeholders():
    proc = cli("report", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "RUN_DIR" in proc.stdout and "<list" not in proc.stdout and "<bool>" not in proc.stdout
    proc = cli("eval", "--help")
    assert "--timeout" in proc.stdout and "SECONDS" in proc.stdout and "<bool>" not in proc.stdout
    assert cli("--version").stdout.startswith("cuda-l1 ")


@pytest.mark.parametrize("command", [["tasks", "list", "builtin"], ["bench", "builtin", "--device", "cpu"],
                                     ["optimize", "builtin", "--device", "cpu"], ["calibrate", "builtin"]])
def test_a_level_filter_that_matches_nothing_says_so(command, tmp_path):
    proc = cli(*command, "--levels", "9", cwd=tmp_path)
    assert_one_paragraph(proc, 2, "no task matched --levels 9", "1, 2, 3")
    assert not (tmp_path / "runs").exists()  # nothing was started


BROKEN = {
    "inputs": ("return [torch.randn(64)]", 'raise RuntimeError("no inputs today")',
               "get_inputs() raised RuntimeError: no inputs today"),
    "forward": ("return x * 2", 'raise ValueError("forward broke")',
                "Model.forward(*get_inputs()) raised ValueError: forward broke"),
    "init": ("return []", "return [1, 2, 3]", "Model(*get_init_inputs()) raised TypeError"),
    "module": ("import torch.nn as nn", "import torch.nn as nn\nimport no_such_module_here",
               "executing the module raised ModuleNotFoundError"),
    # each of these ended without a verdict or a message: status 0 and no output (sys.exit), a
    # traceback (a complex argument sent to a side; a sparse input copied into a slot), or the
    # candidate blamed ("incorrect") for an output no code could match
    "exit": ("import torch.nn as nn", "import torch.nn as nn\nimport sys\nsys.exit(0)",
             "executing the module raised SystemExit"),
    # a class of the task's own derived from BaseException: past every `except Exception`, it ended a
    # worker, which then blamed the candidate for the worker's deaths
    "base_exception": ("return x * 2", "class Stop(BaseException):\n            pass\n        raise Stop('odd')",
                       "Model.forward(*get_inputs()) raised Stop: odd"),
    "complex": ("return [torch.randn(64)]", "return [torch.randn(64), 1j]", "get_inputs()[1] is a complex"),
    "sparse": ("return [torch.randn(64)]", "return [torch.randn(64).to_sparse()]", "is a sparse_coo tensor"),
    "output": ("return x * 2", "return (x * 2).to_sparse()", "returned a sparse_coo tensor as output 0"),
    # read by memory, these passed a wrong candidate: a subclass's output was never compared, a lazy
    # conjugate's memory holds the unconjugated values
    "subclass": ("return x * 2", "return nn.Parameter(x * 2)", "returned a Parameter (a tensor subclass"),
    "conj": ("return x * 2", "return torch.fft.fft(x).conj()", "returned a lazily conjugated or negated view"),
    # random draws in forward: every call, the float64 oracle's too, drew its own, and the allowance
    # scaled by the reference's own error let a candidate 40% off everywhere pass at 1.4
    "dropout": ("return x * 2", "return torch.nn.functional.dropout(x * 2, 0.5, training=True)",
                "gave other outputs for the same inputs on a second call"),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_broken_reference_is_bad_input_not_a_traceback(what, tmp_path):
    old, new, message = BROKEN[what]
    (tmp_path / "ref.py").write_text(GOOD_TASK.replace(old, new, 1))
    (tmp_path / "cand.py").write_text(CANDIDATE)
    proc = cli("eval", "ref.py", "cand.py", "--device", "cpu", "--quick", cwd=tmp_path)
    assert_one_paragraph(proc, 2, "ref.py", message)


def test_a_broken_task_found_by_a_worker_is_bad_input_after_the_other_tasks(tmp_path):
    """Without the noise check, no reference runs before the workers judge: the worker that prepares a
    task runs its reference first, and a broken one is bad input (one paragraph, exit 2) once the other
    tasks are judged, with no candidate blamed for it."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "1_good.py").write_text(GOOD_TASK)
    (folder / "2_bad.py").write_text(GOOD_TASK.replace("return x * 2", 'raise ValueError("forward broke")'))
    (folder / "3_odd.py").write_text(GOOD_TASK.replace("return x * 2", "class Stop(BaseException):\n"
                                                       "            pass\n        raise Stop('forward broke')"))
    started = time.monotonic()
    proc = cli("bench", str(folder), "--device", "cpu", "--strategies", "eager", "--no-calibrate",
               "--out", str(tmp_path / "run"))
    assert_one_paragraph(proc, 2, "2_bad.py", "line 9", "3_odd.py", "Stop: forward broke", after_progress=True)
    assert time.monotonic() - started < 60
    with sqlite3.connect(tmp_path / "run" / "history.sqlite") as conn:
        judged = [row[0] for row in conn.execute("SELECT t.name FROM verdicts v JOIN tasks t ON t.id = v.task_id")]
    assert judged == ["1_good"]  # judged, and no candidate blamed for the broken task


@pytest.mark.parametrize("args, needle", [
    (["--timeout", "inf"], "--timeout takes a finite number of seconds"),  # a hanging candidate held its worker
    (["--cluster", "bogus"], "--cluster is local, ray or ray://ADDRESS"),  # taken when every verdict was resumed
    (["--cluster", "ray://"], "--cluster is local, ray or ray://ADDRESS"),
])
def test_options_a_resumed_run_would_not_use_are_still_checked(args, needle, tmp_path):
    assert_one_paragraph(cli("bench", "builtin", "--device", "cpu", "--no-calibrate", "--out", str(tmp_path / "r"),
                             *args, cwd=tmp_path), 2, needle)

def test_task_descriptions_keep_their_square_brackets(tmp_path):
    (tmp_path / "1_pair.py").write_text(GOOD_TASK)
    proc = cli("tasks", "list", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "[h', c']" in proc.stdout
    assert "1 task from" in proc.stdout


@pytest.mark.slow
def test_an_endpoint_that_always_fails_stops_the_run_with_exit_1(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "1_double.py").write_text(GOOD_TASK)
    with ChatServer(responder=lambda body: Reply(status=401, error_message="bad key")) as server:
        proc = cli("optimize", str(tmp_path / "tasks"), "--base-url", server.base_url, "--model", "test-model",
                   "--strategies", "eager", "--device", "cpu", "--no-calibrate", "--out", str(tmp_path / "run"))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "stopped early" in proc.stderr and "bad key" in proc.stderr
    assert "Traceback" not in text
    assert (tmp_path / "run" / "report.html").is_file()  # what was judged is still reported


def test_the_timeout_defaults_in_help_are_the_evaluators():
    from cuda_l1.cli.options import DEFAULT_TASK_TIMEOUT_S, DEFAULT_TIMEOUT_S
    from cuda_l1.evaluate.config import EvalConfig

    assert DEFAULT_TIMEOUT_S == EvalConfig().timeout_s
    assert DEFAULT_TASK_TIMEOUT_S == EvalConfig().task_timeout_s


LOOPING = textwrap.dedent('''
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            while True:
                pass
''')


@pytest.mark.slow
def test_timeout_bounds_a_candidate_that_never_returns(tmp_path):
    import json
    import time

    (tmp_path / "ref.py").write_text(GOOD_TASK)
    (tmp_path / "loop.py").write_text(LOOPING)
    started = time.monotonic()
    proc = cli("eval", "ref.py", "loop.py", "--device", "cpu", "--quick", "--timeout", "15", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict = json.loads(proc.stdout)
    assert verdict["status"] == "timeout"
    assert verdict["elapsed_s"] < 30 and time.monotonic() - started < 90  # not the 305 s it used to take


def test_bad_input_inside_an_exception_group_is_one_paragraph():
    """optimize's loop runs in an asyncio TaskGroup, which wraps what its tasks raise: a broken task
    found there is still bad input, said in one paragraph with exit code 2, not a traceback."""
    from cuda_l1.cli.app import _first_said
    from cuda_l1.errors import BrokenTask, RunError

    broken = BrokenTask("9_big.py: Model.forward(*get_inputs()) raised ValueError: forward broke")
    nested = ExceptionGroup("loop", [ValueError("other"), ExceptionGroup("inner", [broken])])
    assert _first_said(nested) is broken
    assert isinstance(_first_said(ExceptionGroup("g", [RunError("endpoint gone")])), RunError)
    assert _first_said(ExceptionGroup("g", [ValueError("a bug")])) is None


def test_the_reference_is_checked_in_the_module_mode_it_is_judged_in(tmp_path):
    """A BatchNorm over a batch of one runs in eval mode only: with --module-mode eval the reference's
    one run (TaskEnv) is made in eval mode too, not refused as broken."""
    (tmp_path / "ref.py").write_text(GOOD_TASK.replace("return x * 2", "return self.bn(x)").replace(
        "class Model(nn.Module):\n", "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.bn = nn.BatchNorm1d(64)\n\n").replace("torch.randn(64)", "torch.randn(1, 64)"))
    (tmp_path / "cand.py").write_text((tmp_path / "ref.py").read_text().replace("class Model(", "class ModelNew("))
    train = cli("eval", "ref.py", "cand.py", "--device", "cpu", "--no-timing", cwd=tmp_path)
    assert_one_paragraph(train, 2, "ref.py", "Expected more than 1 value per channel")
    judged = cli("eval", "ref.py", "cand.py", "--device", "cpu", "--no-timing", "--module-mode", "eval", "--json",
                 cwd=tmp_path)
    assert judged.returncode == 0, judged.stderr[-2000:]
    assert json.loads(judged.stdout)["status"] == "ok"


def test_paths_that_cannot_be_used_and_a_damaged_store_are_one_paragraph(tmp_path):
    """Each of these ended in a traceback: --out naming a file, a directory where the report writes a
    file (after the verdicts were stored), a stored verdict cut short."""
    (tmp_path / "task.py").write_text(GOOD_TASK)
    (tmp_path / "afile").write_text("")
    proc = cli("bench", "task.py", "--device", "cpu", "--strategies", "eager", "--no-calibrate",
               "--out", "afile", cwd=tmp_path)
    assert_one_paragraph(proc, 2, "afile", "File exists")
    started = time.monotonic()  # calibrate's --out found a file only after its minutes of measuring
    assert_one_paragraph(cli("calibrate", "task.py", "--device", "cpu", "--out", "afile", cwd=tmp_path), 2,
                         "afile", "this is a file")
    assert_one_paragraph(cli("calibrate", "task.py", "--device", "cpu", "--out", "afile/sub", cwd=tmp_path), 2,
                         "afile")
    assert time.monotonic() - started < 30
    run = ["bench", "task.py", "--device", "cpu", "--strategies", "eager", "--no-calibrate", "--out", "run"]
    (tmp_path / "run" / "summary.json").mkdir(parents=True)
    proc = cli(*run, cwd=tmp_path)
    assert_one_paragraph(proc, 2, "summary.json", "Is a directory", after_progress=True)
    with sqlite3.connect(tmp_path / "run" / "history.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0] == 1  # judged and kept
        conn.execute("UPDATE verdicts SET verdict = '{cut short'")
    (tmp_path / "run" / "summary.json").rmdir()
    proc = cli(*run, cwd=tmp_path)
    assert_one_paragraph(proc, 2, "a stored verdict could not be read", after_progress=True)
