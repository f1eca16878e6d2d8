"""Timing stops as soon as the interval decides what the caller needs (a bucket edge, the best so far),
clear of each threshold by a margin, and never before min_rounds."""

from __future__ import annotations

import dataclasses

import pytest

from cuda_l1.evaluate import timing
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.tasks import Task

CAPS = dict(min_rounds=12, max_rounds=100, max_time_s=10.0, target_width=0.02)


def est(lo: float, hi: float) -> timing.Estimate:
    return timing.Estimate((lo + hi) / 2, lo, hi, 1.0, 1.0)


def test_an_interval_clear_of_every_threshold_decides():
    edges = (0.8, 1.0, 1.2, 1.5)
    assert timing.stop_reason(12, est(0.50, 0.62), 1.0, thresholds=edges, **CAPS) == "decided"
    assert timing.stop_reason(12, est(1.27, 1.40), 1.0, thresholds=edges, **CAPS) == "decided"
    assert timing.stop_reason(12, est(0.90, 1.10), 1.0, thresholds=edges, **CAPS) is None  # straddles 1.0
    assert timing.stop_reason(12, est(1.01, 1.10), 1.0, thresholds=edges, **CAPS) is None  # within the margin
    assert timing.stop_reason(12, est(0.50, 0.62), 1.0, **CAPS) is None  # no thresholds: only narrow or the caps
    assert timing.stop_reason(11, est(0.50, 0.62), 1.0, thresholds=edges, **CAPS) is None  # before min_rounds
    assert timing.stop_reason(100, est(0.9, 1.1), 1.0, **CAPS) == "rounds"
    assert timing.stop_reason(20, est(0.9, 1.1), 10.0, **CAPS) == "time"
    assert timing.stop_reason(20, est(0.995, 1.005), 1.0, **CAPS) == "narrow"


REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1.0


def get_inputs():
    return [torch.randn(128, 128)]


def get_init_inputs():
    return []
"""


@pytest.mark.slow
def test_an_evaluation_with_far_thresholds_stops_at_its_first_estimate():
    quick = TimingConfig.quick()
    # The time cap is checked before "decided", and 12 rounds took 2.9-3.5 s with one busy process
    # beside the 2-core host: a cap far away, and a round cap for the evaluation without thresholds.
    quick.max_time_s, quick.max_rounds = 30.0, 16
    evaluator = Evaluator(Task(name="1_ReluPlus", level=1, source=REFERENCE),
                          EvalConfig(device="cpu", timing=quick, correctness_trials=2))
    try:
        candidate = REFERENCE.replace("class Model(", "class ModelNew(")
        decided = evaluator.evaluate(candidate, remeasure=False, thresholds=(100.0,))
        assert decided.status == "ok" and decided.timing["stopped"] == "decided"
        assert decided.timing["rounds"] == 12 and decided.timing["thresholds"] == [100.0]  # the first estimate
        plain = evaluator.evaluate(candidate, remeasure=False)
        assert plain.timing["stopped"] in ("narrow", "rounds", "time") and "thresholds" not in plain.timing
    finally:
        evaluator.close()


def test_verdicts_with_and_without_early_stops_are_filed_apart():
    base = EvalConfig(device="cpu")
    keys = {EvalConfig(device="cpu", timing=dataclasses.replace(base.timing, **change)).config_key()
            for change in ({}, {"decide_early": False}, {"decide_margin": 0.1})}
    assert len(keys) == 3 and base.config_key() in keys


def test_verdicts_measured_with_a_settle_pause_are_filed_apart_and_the_pause_is_bounded():
    from cuda_l1.errors import UserError

    gpu = EvalConfig(device="cuda")  # the pause is on by default there
    unsettled = EvalConfig(device="cuda", timing=dataclasses.replace(gpu.timing, settle_s=0.0))
    assert gpu.timing.settle_s == 0.02 and "settle=0.02" in gpu.config_key()
    assert unsettled.config_key() != gpu.config_key() and "settle" not in unsettled.config_key()
    # On a CPU no pause is made, so the key does not depend on it.
    cpu = EvalConfig(device="cpu")
    assert cpu.config_key() == EvalConfig(device="cpu", timing=dataclasses.replace(cpu.timing, settle_s=0.0)).config_key()
    assert "settle" not in cpu.config_key()
    with pytest.raises(UserError, match="settle_s"):
        EvalConfig(device="cpu", timing=dataclasses.replace(cpu.timing, settle_s=5.0))


def test_the_time_cap_never_ends_timing_before_min_rounds():
    """One round gives an interval of no width: a lucky one would score as a sure speedup."""
    assert timing.stop_reason(1, est(1.28, 1.28), 99.0, **CAPS) is None
    assert timing.stop_reason(11, est(1.2, 1.3), 99.0, **CAPS) is None
    assert timing.stop_reason(12, est(1.2, 1.3), 99.0, **CAPS) == "time"


def test_too_few_rounds_for_an_interval_score_one():
    from cuda_l1.evaluate.speedup_stats import conservative_speedup, speedup_ci

    point, lo, hi = speedup_ci([1.28, 1.30], [1.0, 1.0])
    assert point > 1.2 and conservative_speedup(point, lo, hi) == 1.0
