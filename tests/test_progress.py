"""Progress as a user watching a long run sees it: an estimate that works for slow steps, one line per
verdict when the output is a log, and error details that show the candidate's own code."""

from __future__ import annotations

import io
import random
import textwrap
from types import SimpleNamespace

from cuda_l1.progress import EvalProgress, clock, plain_line, time_left
from cuda_l1.report.plots import task_bar_data
from cuda_l1.report.aggregates import task_outcomes
from cuda_l1.search.display import Display
from cuda_l1.tasks.runtime import CANDIDATE_FILENAME, candidate_traceback, load_module


def test_time_left_comes_from_the_whole_run_however_slow_each_step():
    assert time_left(elapsed=600.0, done=10, total=72) == 600.0 / 10 * 62  # a minute per verdict
    assert time_left(elapsed=5.0, done=0, total=72) is None
    assert clock(3725) == "1:02:05" and clock(None) == "?"


def test_lines_when_not_a_terminal_one_per_verdict_each_flushed():
    class Stream(io.StringIO):
        flushes = 0

        def flush(self):
            Stream.flushes += 1

    stream = Stream()
    with EvalProgress(3, stream=stream) as bar:
        assert bar.mode == "lines"  # a StringIO is no terminal
        for name in ("L1/a eager ok 1.00x", "L1/b [x] runtime_error", "L1/c compile ok 1.50x"):
            bar.advance(name)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "evaluating 3 candidate(s)"
    assert lines[1].startswith("[1/3] L1/a eager ok 1.00x") and "left)" in lines[1]
    assert "[x]" in lines[2]  # brackets are text
    assert lines[3].startswith("[3/3]") and "left" not in lines[3]
    assert Stream.flushes >= 4


def test_disabled_progress_prints_nothing():
    stream = io.StringIO()
    with EvalProgress(2, enabled=False, stream=stream) as bar:
        bar.advance("x")
    assert stream.getvalue() == ""
    assert "about 0:00:10 left" in plain_line(1, 2, 10.0, "t")


def test_the_optimizer_table_becomes_lines_off_a_terminal():
    task = SimpleNamespace(key="L1/19_ReLU")
    st = SimpleNamespace(task=task, spent=0, budget=4, requesting=0, evaluating=0, parse_errors=0, best=None,
                         best_origin="", last="", evaluated=0, reused=0)
    stream = io.StringIO()
    with Display([st], enabled=True, stream=stream) as display:
        st.last = "evaluating"
        display.refresh()  # work in flight is not a result
        st.spent, st.evaluated, st.last, st.best, st.best_origin = 1, 1, "ok 1.42x", 1.42, "llm:m[1]"
        display.refresh()
        display.refresh()  # nothing changed: nothing printed
    lines = stream.getvalue().splitlines()
    assert lines[0] == "optimizing: 1 task(s)"
    assert len(lines) == 2 and "L1/19_ReLU: ok 1.42x (best 1.42x from llm:m[1]" in lines[1]


CANDIDATE = textwrap.dedent('''
    import torch


    def helper(x):
        return torch.mm(x, x)  # a 1-D tensor: torch raises


    class ModelNew(torch.nn.Module):
        def forward(self, x):
            return helper(x)
''')


def test_candidate_traceback_shows_the_candidates_frames_and_where_it_surfaced():
    module = load_module(CANDIDATE, f"cand_{random.randrange(1 << 30)}", CANDIDATE_FILENAME)
    try:
        module.ModelNew()(__import__("torch").ones(3))
    except RuntimeError as exc:
        text = candidate_traceback(exc)
    lines = text.splitlines()
    assert lines[0].startswith("Traceback (candidate.py frames;")
    assert 'File "candidate.py", line 11, in forward' in text
    assert 'File "candidate.py", line 6, in helper' in text and "torch.mm(x, x)" in text
    assert "test_progress.py" not in text and "module.py" not in text  # harness and library frames dropped
    assert lines[-1].startswith("RuntimeError:")


def test_candidate_traceback_of_a_syntax_error_names_the_line():
    try:
        load_module("class ModelNew(:\n    pass\n", "cand_syntax", CANDIDATE_FILENAME)
    except SyntaxError as exc:
        text = candidate_traceback(exc)
    assert 'File "candidate.py", line 1' in text and "SyntaxError" in text
    assert len(candidate_traceback(ValueError("x" * 10000), limit=200)) == 200


def test_task_bars_carry_the_winner_and_its_interval():
    rows = [{"task_id": "a", "task_name": "a", "level": 1, "origin": "eager", "status": "ok", "speedup": 1.0,
             "raw_speedup": 1.0, "ci": [0.98, 1.02]},
            {"task_id": "a", "task_name": "a", "level": 1, "origin": "compile", "status": "ok", "speedup": 1.4,
             "raw_speedup": 1.5, "ci": [1.4, 1.6]},
            {"task_id": "b", "task_name": "b", "level": 2, "origin": "compile", "status": "runtime_error"}]
    bars = task_bar_data(task_outcomes(rows))
    assert bars[0] == (1.4, 1, "a", "compile", (1.4, 1.6))
    assert bars[1] == (1.0, 2, "b", None, None)
