"""A candidate slow only in its first calls does not keep the windows it shortened: the windows are
sized on the warm-up, and looked at again every min_rounds recorded rounds (referee.measure)."""

from __future__ import annotations

from pathlib import Path

from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import evaluate
from cuda_l1.tasks import load_task_file

REFS = Path(__file__).parent / "corpus" / "refs"

SLOW_THROUGH_MIN_ROUNDS = '''
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """About 0.01-0.03x the reference (8 matmuls beside the relu), and its first 16 calls sleep too:
    the warm-up sizes every window to one call, and the first min_rounds recorded calls are still
    slow when the windows are first looked at again."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(192, 192))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls <= 16:
            time.sleep(0.25)
        for _ in range(8):
            self.w @ self.w
        return torch.relu(x)
'''


def test_a_candidate_slow_through_the_first_recorded_rounds_is_timed_at_its_speed():
    """With one look, after the first min_rounds rounds, this candidate kept one call a window: both
    sides sat in a window's fixed cost and it scored 1.00 (raw 0.87-0.96, the full protocol, twice)."""
    timing = TimingConfig(warmup_rounds=3, min_rounds=12, max_time_s=10.0, remeasure_above=1e9)
    verdict = evaluate(load_task_file(REFS / "tiny_relu.py"), SLOW_THROUGH_MIN_ROUNDS,
                       EvalConfig(device="cpu", timing=timing, remeasure=False))
    assert verdict.status == "ok", verdict.reasons
    assert verdict.timing.get("replanned"), verdict.timing.get("calls_per_window")
    assert verdict.raw_speedup < 0.5 and verdict.speedup < 0.5, (verdict.raw_speedup, verdict.speedup)
