"""Both sides of a CPU timing run under the same conditions: one core, one host-allocator policy. The
parent gets its own CPU affinity back afterwards, and a pool's CPU workers time on different cores."""

from __future__ import annotations

import os

import pytest

from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.evaluate.task_env import timing_core
from cuda_l1.evaluate.jobs import EvalJob
from cuda_l1.evaluate.local_pool import LocalPool
from cuda_l1.evaluate.verdict import OK
from cuda_l1.tasks import make_task

REFERENCE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x) * x


def get_inputs():
    return [torch.randn(2048)]


def get_init_inputs():
    return []
'''
CANDIDATE = REFERENCE.replace("class Model(", "class ModelNew(")

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")


@pytest.fixture(scope="module")
def task():
    return make_task(REFERENCE, name="silu", level=1, origin="test:silu")


def _config(**kw) -> EvalConfig:
    return EvalConfig(device="cpu", timing=TimingConfig.quick(), correctness_trials=2, **kw)


@needs_affinity
def test_the_timing_core_follows_device_threads_and_affinity():
    allowed = os.sched_getaffinity(0)
    assert timing_core(_config()) in allowed  # the idlest of them
    assert timing_core(_config(cpu_core=min(allowed))) == min(allowed)
    assert timing_core(_config(threads=2)) is None  # several threads: pinning would serialise them
    assert timing_core(EvalConfig(device="cuda")) is None
    assert timing_core(_config(cpu_core=10_000)) is None  # not a core this process may use


@needs_affinity
def test_child_and_parent_share_a_core_and_the_allocator_policy(task):
    before = os.sched_getaffinity(0)
    evaluator = Evaluator(task, _config())
    try:
        verdict = evaluator.evaluate(CANDIDATE)
    finally:
        evaluator.close()
    assert verdict.status == OK, verdict.reasons
    assert int(verdict.sandbox["cpu_core"]) in before
    assert os.sched_getaffinity(0) == before  # the parent pins itself only to flush that core's caches


@needs_affinity
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_pool_workers_time_on_different_cores(task):
    cores = sorted(os.sched_getaffinity(0))[:2]
    pool = LocalPool("cpu", _config(), workers=2, remeasure_elsewhere=False)
    try:
        results = list(pool.run([EvalJob(task, CANDIDATE + f"\n# copy {i}\n", key=str(i)) for i in range(4)]))
    finally:
        pool.close()
    assert all(r.verdict.status == OK for r in results)
    # The first two jobs go to the two idle workers at once, so both cores are used.
    assert {r.verdict.sandbox["cpu_core"] for r in results} == {str(c) for c in cores}


@needs_affinity
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_an_evaluator_times_on_a_core_no_one_else_keeps_busy():
    import subprocess
    import sys

    busy = min(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{busy}}})\nwhile True: pass"])
    try:
        import time

        time.sleep(0.3)
        others = sorted(os.sched_getaffinity(0) - {busy})
        before = _idle_ticks(others)
        chosen = timing_core(_config())
        if not any(after > was for after, was in zip(_idle_ticks(others), before)):
            pytest.skip("no other core was idle either (the host is busy): no idlest core to find")
        assert chosen != busy
    finally:
        spinner.kill()
        spinner.wait()


def _idle_ticks(cores: list[int]) -> list[int]:
    """Idle ticks of each core so far (/proc/stat's fourth field)."""
    ticks = {}
    with open("/proc/stat") as stat:
        for line in stat:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                ticks[int(name[3:])] = int(fields[3])
    return [ticks.get(core, 0) for core in cores]


def test_on_a_cpu_each_candidate_meets_a_reference_side_as_new_as_its_own(task):
    """On the 2-core host a reference side that had served earlier candidates read 5-10% faster than a
    new candidate's side running identical code (ChannelSoftmax): on a CPU each evaluation starts a
    reference side of its own; with fresh_reference=False (a GPU's default) one serves them all."""
    for fresh, new_each_time in ((None, True), (False, False)):
        evaluator = Evaluator(task, _config(fresh_reference=fresh))
        served, settle = [], evaluator._settle_reference

        def note_then_settle():
            served.append(evaluator.env.ref.proc.harness_pid())
            settle()

        evaluator._settle_reference = note_then_settle
        try:
            verdicts = [evaluator.evaluate(CANDIDATE + f"\n# copy {i}\n") for i in range(3)]
            left = evaluator.env.ref
        finally:
            evaluator.close()
        assert all(v.status == OK for v in verdicts), [v.reasons for v in verdicts]
        assert len(set(served)) == (3 if new_each_time else 1), served
        assert (left is None) == new_each_time
        # What starting it cost is reported with the verdicts after the first (whose is the task's setup).
        assert [("start_reference" in v.timing["phases_s"]) for v in verdicts] == [False, new_each_time, new_each_time]
        # read before the side ends (docs/timing.md: the reference's harness work per call)
        assert all(v.timing["reference_harness_us"] is not None for v in verdicts), verdicts[-1].timing
