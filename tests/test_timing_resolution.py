"""A speedup is measured only where the windows are longer than the fixed overhead taken off them.

On a GPU the inputs of a window are written inside it, so for a task whose calls cost about what
copying their inputs does (KernelBench level 1's scalar multiplication of a 16384 x 4096 matrix), the
overhead is as large as the calls and drifts: windows came out no longer than it, their per-call times
at the floor, and a raw speedup of 631 with an interval of 0.001-1331. Such a verdict says so and scores
1.00, whichever side lost its calls in the overhead."""

from __future__ import annotations

import pytest

from cuda_l1.evaluate import timing
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.tasks import Task


def test_a_side_with_many_windows_at_the_overhead_is_not_measured():
    assert timing.at_overhead(timing.Window(15, 0.0070, 0.001), 0.0078)
    assert not timing.at_overhead(timing.Window(15, 0.0090, 0.001), 0.0078)
    assert timing.resolution_note({"reference": 0, "candidate": 0}, 100, 0.001) is None
    assert timing.resolution_note({"reference": 10, "candidate": 3}, 100, 0.001) is None  # 10%: still measured
    note = timing.resolution_note({"reference": 2, "candidate": 11}, 100, 0.0078)
    assert note is not None and "11% of the candidate's" in note and "7.8 ms" in note
    assert "reference's" in timing.resolution_note({"reference": 63, "candidate": 0}, 115, 0.0078)
    assert timing.resolution_note({"reference": 0, "candidate": 0}, 0, 0.001) is None


def test_a_reference_call_within_a_few_times_the_harness_work_is_not_measured():
    # The harness's per-call work runs in the side's process: a candidate can skip it. The reference's
    # side timed its own (trusted); a reference call shorter than HARNESS_FACTOR times it is not measured.
    none = {"reference": 0, "candidate": 0}
    assert timing.resolution_note(none, 100, 0.001, 5e-6, [7e-6, 8e-6, 6e-6]) is not None
    note = timing.resolution_note(none, 100, 0.001, 20e-6, [7e-6] * 5)
    assert "within 4 times the harness's own work per call (7 us)" in note and "20 us" in note
    assert timing.resolution_note(none, 100, 0.001, 40e-6, [7e-6] * 5) is None
    assert timing.resolution_note(none, 100, 0.001, 5e-6, []) is None  # not reported: no floor


REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1.0


def get_inputs():
    return [torch.randn(512, 512)]  # calls of ~0.3 ms: well above the harness floor (timing.HARNESS_FACTOR)


def get_init_inputs():
    return []
"""


def identical_code_verdict():
    """The reference against itself on the CPU, quick timing, no re-measurement."""
    evaluator = Evaluator(Task(name="1_ReluPlus", level=1, source=REFERENCE),
                          EvalConfig(device="cpu", timing=TimingConfig.quick(), correctness_trials=2))
    try:
        return evaluator.evaluate(REFERENCE.replace("class Model(", "class ModelNew("), remeasure=False)
    finally:
        evaluator.close()


@pytest.mark.slow
def test_an_evaluation_whose_windows_are_lost_in_the_overhead_scores_one(monkeypatch):
    # An overhead estimate longer than any window: every recorded window of both sides is at the floor.
    monkeypatch.setattr(timing, "overhead", lambda windows: 10.0)
    verdict = identical_code_verdict()
    assert verdict.status == "ok" and verdict.speedup == 1.0
    check = next(c for c in verdict.checks if c.name == "timing_resolved")
    assert check.passed is False and not check.blocking and "not measured" in check.detail
    rounds = verdict.timing["rounds"]
    assert verdict.timing["windows_at_overhead"] == {"reference": rounds, "candidate": rounds}


def test_windows_under_the_overhead_have_it_measured_again_and_the_lowest_counts_for_every_round():
    fast, slow = timing.Window(8, 0.0016, 0.0015), timing.Window(8, 0.0110, 0.0100)
    assert timing.recheck_overhead((slow, fast), 0.0020, 0) and not timing.recheck_overhead((slow, fast), 0.0007, 0)
    assert not timing.recheck_overhead((slow, fast), 0.0020, timing.OVERHEAD_CHECKS)  # a few times at most
    ref, cand, at = timing.per_call_all([(slow, fast), (slow, fast)], 0.0020)
    assert max(cand) < 1e-5 and at == {"reference": 0, "candidate": 2}  # at the floor: nothing measured
    ref, cand, at = timing.per_call_all([(slow, fast), (slow, fast)], 0.0008)
    assert cand == [pytest.approx(0.1)] * 2 and ref == [pytest.approx(1.275)] * 2 and at["candidate"] == 0


@pytest.mark.slow
def test_an_overhead_caught_at_a_busy_moment_is_measured_again(monkeypatch):
    # The first two measurements of the null windows (before and after the warm-up) come out longer than
    # every window; a third, made because of that, is what it is: the speedup is measured after all.
    real, calls = timing.overhead, []
    monkeypatch.setattr(timing, "overhead", lambda windows: 10.0 if len(calls.append(1) or calls) <= 2 else real(windows))
    verdict = identical_code_verdict()
    assert verdict.status == "ok" and verdict.check("timing_resolved").passed, verdict.timing
    assert verdict.timing["overhead_checks"] == 1 and verdict.timing["window_overhead_ms"] < 1000
    assert 0.2 <= verdict.raw_speedup <= 5.0  # identical code; a loaded 2-core host strays far, the overhead must not
