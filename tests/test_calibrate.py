"""The A/A noise check: how a spread is judged, which tasks are used, and that reports carry it.

The judgement tests use made-up points (the rule is arithmetic); the end-to-end test times a real
reference against itself through the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from cuda_l1.bench import write_run_report
from cuda_l1.calibrate import (CALIBRATION_NAME, eager_spread, judge_spread, load_calibrations, pick_tasks,
                               save_calibration, verdict_text)
from cuda_l1.evaluate.verdict import Verdict
from cuda_l1.report import as_row
from cuda_l1.tasks import make_task

TASK = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1


    def get_inputs():
        return [torch.randn(4096)]


    def get_init_inputs():
        return []
''')


def point(raw: float, ci: tuple[float, float], status: str = "ok") -> dict:
    scored = 1.0 if ci[0] <= 1.0 <= ci[1] else (ci[0] if ci[0] > 1 else ci[1])
    return {"status": status, "raw_speedup": raw, "speedup": scored, "ci": list(ci)}


def test_identical_code_within_the_band_passes():
    result = judge_spread([point(1.01, (0.98, 1.03)), point(0.99, (0.97, 1.02)), point(1.03, (0.99, 1.06))], 0.05)
    assert not result["too_noisy"] and result["reasons"] == []
    assert result["raw_min"] == 0.99 and result["raw_max"] == 1.03 and result["n_outside_band"] == 0


def test_identical_code_measured_faster_is_too_noisy():
    # The busy host: eager (the reference unchanged) at a median 1.23x, intervals above 1.
    result = judge_spread([point(1.23, (1.15, 1.31)), point(1.4, (1.2, 1.6)), point(1.01, (0.97, 1.05))], 0.05)
    assert result["too_noisy"]
    assert any("median 23.0% away" in r for r in result["reasons"])
    assert any("2 of 3 identical-code intervals exclude 1.00" in r for r in result["reasons"])
    assert "too noisy" in verdict_text({**result, "kind": "calibration"})


def test_intervals_that_exclude_one_count_even_inside_the_band():
    points = [point(1.03, (1.02, 1.04)), point(0.97, (0.96, 0.98)), point(1.0, (0.99, 1.01))]
    result = judge_spread(points, 0.05)
    assert result["too_noisy"] and result["n_scored_off"] == 2
    assert not judge_spread(points[:1] + [point(1.0, (0.99, 1.01))] * 3, 0.05)["too_noisy"]  # 1 of 4


def test_many_measurements_outside_the_band_are_too_noisy_even_with_a_quiet_median():
    # A busy host measured with quick timing: wide intervals (so every score is 1.00), a median near
    # 1, and yet a third of the identical-code measurements far off.
    wide = [point(r, (0.5, 1.6)) for r in (1.0, 1.01, 0.99, 1.0, 0.7, 1.2, 0.29)]
    result = judge_spread(wide, 0.05)
    assert result["median_deviation"] <= 0.05 and result["n_scored_off"] == 0
    assert result["too_noisy"] and "3 of 7 identical-code measurements fall outside 1 +- 0.05" in result["reasons"][0]
    assert not judge_spread(wide[:6], 0.05)["too_noisy"]  # 2 of 6: a third, allowed


def test_identical_code_that_fails_is_too_noisy():
    result = judge_spread([point(1.0, (0.99, 1.01)), {"status": "timeout", "raw_speedup": None, "speedup": None}],
                          0.05)
    assert result["too_noisy"] and "did not come out ok" in result["reasons"][0]


def test_a_runs_eager_candidate_that_fails_is_its_tasks_failure_not_noise(tmp_path):
    rows = [_row("eager", 1.0 + i / 1000, (0.98, 1.03)) for i in range(4)]
    failed = _row("eager", 0.5, (0.4, 0.6))
    failed.verdict.status = "timeout"
    spread = eager_spread(rows + [failed], "cpu")
    assert not spread["too_noisy"] and spread["n_failed"] == 1 and spread["n_ok"] == 4
    assert "1 identical-code evaluation(s) did not come out ok" in verdict_text(spread)
    alone = eager_spread([failed], "cpu")  # nothing measured: no check, not a noisy host
    assert not alone["too_noisy"] and verdict_text(alone).startswith("no noise check: none of 1")
    many = eager_spread(rows[:2] + [failed, failed], "cpu")  # half of them failed: that says something
    assert many["too_noisy"] and "2 of 4 identical-code evaluations did not come out ok" in many["reasons"][0]


def test_calibration_tasks_are_spread_over_the_levels():
    tasks = [make_task(TASK.replace("+ 1", f"+ {i}"), name=f"{i}_t", level=1 + i % 3, origin=f"t{i}")
             for i in range(9)]
    picked = pick_tasks(tasks, 4)
    assert [t.level for t in picked] == [1, 2, 3, 1]
    assert pick_tasks(tasks, 4) == picked  # the same tasks on every rerun
    assert len(pick_tasks(tasks[:2], 5)) == 2


def _row(origin: str, raw: float, ci: tuple[float, float], device: str = "cpu (x86_64)"):
    p = point(raw, ci)
    verdict = Verdict(status="ok", speedup=p["speedup"], raw_speedup=raw, ci=list(ci), reference_ms=1.0,
                      candidate_ms=1.0 / raw, device=device, task_id=f"id-{raw}", task_name=f"t{raw}")
    return as_row({"task_id": f"id-{raw}", "task_name": f"t{raw}", "level": 1, "origin": origin, "verdict": verdict})


def test_a_noisy_calibration_marks_the_summary_and_the_report(tmp_path):
    save_calibration(tmp_path, {"kind": "calibration", "what": "test", "device": "cpu",
                                **judge_spread([point(1.3, (1.2, 1.4))] * 3, 0.05)})
    rows = [_row("eager", 1.0, (0.98, 1.02)), _row("compile", 1.5, (1.4, 1.6))]
    write_run_report(tmp_path, rows, "cuda-l1 bench: test")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["noise"]["too_noisy"] and summary["noise"]["calibration"]["raw_median"] == 1.3
    assert summary["noise"]["eager"]["n"] == 1 and not summary["noise"]["eager"]["too_noisy"]
    html = (tmp_path / "report.html").read_text()
    assert "HOST TOO NOISY" in html and "Do not publish these numbers" in html


def test_a_quiet_run_is_not_marked_and_says_what_it_checked(tmp_path):
    rows = [_row("eager", 1.0 + i / 1000, (0.98, 1.03)) for i in range(4)]
    write_run_report(tmp_path, rows, "cuda-l1 bench: test")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["noise"]["checked"] and not summary["noise"]["too_noisy"]
    assert summary["noise"]["calibration"] is None  # no calibration.json in this directory
    assert "HOST TOO NOISY" not in (tmp_path / "report.html").read_text()
    assert eager_spread([rows[0]], "cuda")["band"] == 0.02  # a GPU's band is narrower


def test_the_report_says_what_ran_where_and_when(tmp_path):
    write_run_report(tmp_path, [_row("compile", 1.2, (1.1, 1.3))], "cuda-l1 bench: test")
    prov = json.loads((tmp_path / "summary.json").read_text())["provenance"]
    assert prov["date"][:2] == "20" and prov["versions"]["cuda_l1"] and prov["versions"]["torch"]
    assert "command" in prov and prov["hardware"]["cpu_count"] >= 1
    html = (tmp_path / "report.html").read_text()
    assert prov["date"] in html and "git commit" in html and prov["versions"]["torch"] in html


def test_calibrations_accumulate_and_the_latest_is_read_back(tmp_path):
    check = {"kind": "calibration", "what": "identical code", "device": "cpu", "too_noisy": False, "n_ok": 0,
             "band": 0.05, "n_outside_band": 0, "n_scored_off": 0}
    save_calibration(tmp_path, {**check, "n": 1})
    save_calibration(tmp_path, {**check, "n": 2})
    assert [c["n"] for c in load_calibrations(tmp_path)] == [1, 2]
    (tmp_path / CALIBRATION_NAME).write_text("{not json")
    assert load_calibrations(tmp_path) == []


@pytest.mark.slow
def test_calibrate_command_times_the_reference_against_itself(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "1_relu.py").write_text(TASK)
    proc = subprocess.run([sys.executable, "-m", "cuda_l1", "calibrate", str(tmp_path / "tasks"), "--device", "cpu",
                           "--json", "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=600,
                          env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["n"] == 1 and result["points"][0]["status"] == "ok", result
    assert 0.5 < result["points"][0]["raw_speedup"] < 2.0  # identical code: near 1 even on a busy host
    assert set(result) >= {"too_noisy", "reasons", "band", "raw_median"}
    assert load_calibrations(tmp_path / "run")[-1]["points"] == result["points"]


@pytest.mark.parametrize("text", [b'{"checks": [1, 2]}', b'{"checks": 5}', b'{"checks": [{}]}', b"\xff\xfe{", b"{cut"])
def test_a_calibration_file_that_cannot_be_read_is_set_aside_not_lost(tmp_path, text):
    """Each raised past the reader (TypeError, KeyError, UnicodeDecodeError), and a new check
    overwrote a file that could not be parsed."""
    (tmp_path / CALIBRATION_NAME).write_bytes(text)
    assert load_calibrations(tmp_path) == []
    assert (tmp_path / (CALIBRATION_NAME + ".unreadable")).read_bytes() == text
    (tmp_path / CALIBRATION_NAME).write_bytes(text + b" again")  # a second one does not replace the first
    assert load_calibrations(tmp_path) == []
    assert (tmp_path / (CALIBRATION_NAME + ".unreadable.2")).read_bytes() == text + b" again"
