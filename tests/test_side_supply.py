"""Sides started ahead are shared by a worker's evaluators: a new task's reference and first
candidate get warm processes, every candidate still a fresh one, never one of other settings."""

from __future__ import annotations

import time

import pytest

from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.evaluate.side_supply import SideKind, SideSupply
from cuda_l1.tasks import Task


class Started:
    """What the supply needs of a side: whether it runs, its memory limit, closing it."""

    count = 0

    def __init__(self, limit: int, settable: bool = True):
        Started.count += 1
        self.id, self.limit, self.settable, self.closed, self.running = Started.count, limit, settable, False, True
        self.started_at = time.monotonic()

    def exit_info(self):
        return type("Exit", (), {"reason": "running" if self.running and not self.closed else "exited"})()

    def set_memory_limit(self, nbytes: int) -> bool:
        if not self.settable and nbytes != self.limit:
            return False
        self.limit = nbytes
        return True

    def close(self, graceful: bool = True) -> str:
        self.closed = True
        return ""

    calls: list = []

    def freeze(self):
        Started.calls.append(("freeze", self.id))
        if getattr(self, "unstoppable", False):
            from cuda_l1.evaluate.sandbox import ChildFailure

            raise ChildFailure("rejected", "could not be stopped")

    def thaw(self):
        Started.calls.append(("thaw", self.id))

    def started(self) -> bool:
        return getattr(self, "done_starting", False)


A = SideKind("sandbox-a", "cuda", (), None)
B = SideKind("sandbox-b", "cuda", (), None)


def test_a_spare_is_handed_out_once_with_the_limit_of_its_task():
    supply = SideSupply(prewarm=True, spares=2)
    first = supply.take(A, lambda lim: Started(lim), 100)
    assert supply.warm_handed_out == 0 and len(supply._ready) == 2
    second = supply.take(A, lambda lim: Started(lim), 50)
    third = supply.take(A, lambda lim: Started(lim), 70)
    assert len({first.id, second.id, third.id}) == 3  # never the same process twice
    assert (second.limit, third.limit) == (50, 70) and supply.warm_handed_out == 2


def test_spares_of_other_settings_dead_ones_and_fixed_limits_are_not_handed_out():
    supply = SideSupply(prewarm=True, spares=1)
    supply.take(A, lambda lim: Started(lim), 100)
    stale = supply._ready[0][1]
    other = supply.take(B, lambda lim: Started(lim), 100)  # other settings: a new side, the stale spare closed
    assert other is not stale and stale.closed and supply.warm_handed_out == 0
    supply._ready[0][1].running = False  # the spare died
    assert supply.take(B, lambda lim: Started(lim), 100).id != supply._ready[0][1].id
    supply._ready[0] = (B, Started(100, settable=False))
    fixed = supply._ready[0][1]
    assert supply.take(B, lambda lim: Started(lim), 60) is not fixed  # its limit cannot be lowered
    supply.close()
    assert all(spare.closed for _, spare in supply._ready) or not supply._ready


def test_without_prewarming_nothing_is_started_ahead():
    supply = SideSupply(prewarm=False)
    supply.take(A, lambda lim: Started(lim), 100)
    assert supply._ready == []


def test_warming_spares_are_stopped_for_a_window_and_resumed_after(monkeypatch):
    from cuda_l1.evaluate import side_supply

    supply = SideSupply(prewarm=True, spares=2)
    supply.take(A, lambda lim: Started(lim), 100)
    first, second = (p for _, p in supply._ready)
    second.unstoppable = True
    Started.calls.clear()
    settled = []
    with supply.stopped(settle=lambda: settled.append(True)):
        assert Started.calls == [("freeze", first.id), ("freeze", second.id)] and settled == [True]
        assert second.closed and [p for _, p in supply._ready] == [first]  # one that cannot stop is dropped
    assert Started.calls[-1] == ("thaw", first.id)
    first.done_starting = True  # done starting: blocked on its channel, nothing to stop
    Started.calls.clear()
    with supply.stopped(settle=lambda: settled.append(True)):
        pass
    assert Started.calls == []
    first.done_starting = False
    monkeypatch.setattr(side_supply, "WARMING_S", 0.0)  # old spares are idle: nothing to stop
    Started.calls.clear()
    with supply.stopped(settle=lambda: settled.append(True)):
        pass
    assert Started.calls == [] and settled == [True]


REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * SCALE


def get_inputs():
    return [torch.randn(256, 256)]


def get_init_inputs():
    return []
"""


@pytest.mark.timeout(300)
def test_two_tasks_share_warm_sides_and_judge_alike():
    supply = SideSupply(prewarm=True, spares=2)
    # One reference side a task, as on a GPU (on a CPU a new one serves each candidate by default).
    config = EvalConfig(device="cpu", timing=TimingConfig.quick(), correctness_trials=2, prewarm=True,
                        fresh_reference=False)
    tasks = [Task(name=f"tanh_{i}", level=1, source=f"SCALE = {i + 1.0}\n" + REFERENCE) for i in range(2)]
    pids, verdicts = set(), []
    for task in tasks:
        evaluator = Evaluator(task, config, supply=supply)
        try:
            pids.add(evaluator.env.ref.proc.proc.pid)
            for source in (task.source.replace("class Model(", "class ModelNew("),
                           task.source.replace("class Model(", "class ModelNew(").replace("* SCALE", "* SCALE * 2")):
                verdicts.append(evaluator.evaluate(source))
        finally:
            evaluator.close()  # the shared supply stays open: its spares serve the next task
    supply.close()
    assert [v.status for v in verdicts] == ["ok", "incorrect", "ok", "incorrect"]
    assert supply.handed_out == 6 and supply.warm_handed_out >= 4  # the second task's reference came warm
    assert len(pids) == 2


@pytest.mark.timeout(120)
def test_a_real_side_says_it_has_started_once_its_harness_took_the_key():
    from cuda_l1.evaluate.config import SandboxConfig
    from cuda_l1.evaluate.sandbox import SideProcess

    side = SideProcess.start(SandboxConfig(), "cpu", [])
    try:
        assert not side.started()  # importing torch takes longer than this line
        deadline = time.monotonic() + 60
        while not side.started() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert side.started() and side.exit_info().reason == "running"
    finally:
        side.close(graceful=False)
