"""The re-measure rule: a speedup above the threshold counts only after a second measurement in a fresh
process, by another worker (another GPU) when the pool has one, and the lower of the two counts."""

from __future__ import annotations

import dataclasses

import pytest

from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator, evaluate, merge_remeasure, needs_remeasure
from cuda_l1.evaluate.jobs import EvalJob
from cuda_l1.evaluate.local_pool import LocalPool
from cuda_l1.evaluate.verdict import INCORRECT, OK, Check, Verdict
from cuda_l1.tasks import make_task

# The reference repeats its work 64 times; the candidate does it once: a real, large speedup.
REFERENCE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(192, 192) / 10)

    def forward(self, x):
        out = x
        for _ in range(64):
            out = torch.tanh(x @ self.weight)
        return out


def get_inputs():
    return [torch.randn(192, 192)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(192, 192) / 10)

    def forward(self, x):
        return torch.tanh(x @ self.weight)
'''


def _config(**timing) -> EvalConfig:
    tc = dataclasses.replace(TimingConfig.quick(), remeasure_above=2.0, **timing)
    return EvalConfig(device="cpu", timing=tc, correctness_trials=2)


@pytest.fixture(scope="module")
def task():
    return make_task(REFERENCE, name="repeat", level=1, origin="test:repeat")


def _ok(speedup: float, **kw) -> Verdict:
    return Verdict(status=OK, speedup=speedup, raw_speedup=speedup * 1.02, ci=[speedup, speedup * 1.05],
                   reference_ms=1.0, candidate_ms=1.0 / speedup, device="cpu", **kw)


def test_the_rule_and_the_merge():
    cfg = _config()
    assert needs_remeasure(_ok(2.5), cfg) and not needs_remeasure(_ok(1.9), cfg)
    assert needs_remeasure(_ok(1.9), cfg, best_known=0.9)  # more than twice the best known for the task
    assert not needs_remeasure(Verdict(status=INCORRECT), cfg)

    lower = merge_remeasure(_ok(4.0), _ok(3.0, timing={}), "another GPU, cuda:1")
    assert lower.speedup == 3.0 and lower.candidate_ms == pytest.approx(1 / 3)
    assert lower.timing["remeasured"]["where"] == "another GPU, cuda:1"
    higher = merge_remeasure(_ok(3.0), _ok(5.0), "same device, cpu")
    assert higher.speedup == 3.0 and higher.timing["remeasured"]["speedup"] == 5.0

    failed = Verdict(status=INCORRECT, reasons=["input set 2: wrong values"],
                     checks=[Check("correctness", False, "wrong values")])
    refused = merge_remeasure(_ok(4.0), failed, "same device, cpu")
    assert refused.status == INCORRECT and refused.speedup is None
    assert "re-measurement in a fresh process (same device, cpu) failed" in refused.reasons[0]
    assert refused.check("correctness").passed is False


def test_a_large_speedup_is_measured_twice_in_fresh_processes(task):
    verdict = evaluate(task, CANDIDATE, _config())
    assert verdict.status == OK, verdict.reasons
    assert "remeasured" in verdict.timing, (verdict.speedup, verdict.raw_speedup, verdict.ci)
    again = verdict.timing["remeasured"]
    assert again["where"] == "same device, cpu"
    assert verdict.speedup == min(verdict.speedup, again["speedup"]) > 2.0
    # Off, the same candidate is measured once.
    single = evaluate(task, CANDIDATE, dataclasses.replace(_config(), remeasure=False))
    assert single.status == OK and "remeasured" not in single.timing


def test_the_second_measurement_has_a_fresh_reference_side_too(task):
    """A reference side that runs slow for its whole life (a per-process effect) would otherwise make
    the same false speedup twice. (Kept across evaluations otherwise, as on a GPU: on a CPU every
    evaluation has a new one anyway, and the restart would go unseen.)"""
    evaluator = Evaluator(task, dataclasses.replace(_config(), fresh_reference=False))
    pids = []
    settle = evaluator._settle_reference  # at the end of each measurement (on a CPU the side ends there)

    def recorded():
        pids.append(evaluator.env.ref.proc.proc.pid)
        settle()

    evaluator._settle_reference = recorded
    try:
        verdict = evaluator.evaluate(CANDIDATE)
    finally:
        evaluator.close()
    assert verdict.status == OK, verdict.reasons
    assert "remeasured" in verdict.timing, (verdict.speedup, verdict.raw_speedup, verdict.ci, verdict.timing.get("stopped"))
    assert verdict.timing["remeasured"]["reference"] == "a fresh process"
    assert len(pids) == 2 and pids[0] != pids[1]


def test_a_pool_of_two_workers_has_the_other_worker_confirm(task):
    pool = LocalPool("cpu", _config(), workers=2)
    try:
        results = list(pool.run([EvalJob(task, CANDIDATE, key="fast"),
                                 EvalJob(task, CANDIDATE + "\n# the same code again\n", key="twin")]))
    finally:
        pool.close()
    for result in results:
        verdict = result.verdict
        assert verdict.status == OK, verdict.reasons
        assert "remeasured" in verdict.timing, (verdict.speedup, verdict.raw_speedup, verdict.ci)
        again = verdict.timing["remeasured"]
        assert again["where"] in ("another worker process: worker 1 (cpu) after worker 0 (cpu)",
                                  "another worker process: worker 0 (cpu) after worker 1 (cpu)")
        assert verdict.speedup <= again["speedup"] and verdict.speedup > 2.0
