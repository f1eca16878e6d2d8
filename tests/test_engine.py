"""The engine: every caller's one path from a candidate to a stored verdict, each program judged once."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from cuda_l1.engine import Engine
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.jobs import EvalResult
from cuda_l1.evaluate.local_pool import LocalPool
from cuda_l1.evaluate.verdict import Check, Verdict
from cuda_l1.store import Origin, Store
from cuda_l1.tasks import Task, source_id

REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
"""
CANDIDATE = REFERENCE.replace("class Model(", "class ModelNew(")
# Differs only in a comment: still a program of its own (it could read its comments through linecache).
LAYOUT_TWIN = CANDIDATE.replace("return torch.relu(x) * 2.0", "return torch.relu(x) * 2.0  # same, commented")
TASK = Task(name="1_Relu2", level=1, source=REFERENCE)
# One normalised text, two programs: a line continued by `\` runs; the same line with a space after
# the backslash is a syntax error. Only the exact text tells them apart.
CONTINUED_LINE = CANDIDATE.replace("return torch.relu(x) * 2.0", "return torch.relu(x) \\\n            * 2.0")
SPACE_AFTER_BACKSLASH = CONTINUED_LINE.replace("\\\n", "\\ \n")


class HeldPool:
    """A pool whose answers the test releases by hand (the engine sees a real Future either way)."""

    def __init__(self):
        self.jobs: list = []
        self.futures: list[Future] = []

    def submit(self, job) -> Future:
        future: Future = Future()
        self.jobs.append(job)
        self.futures.append(future)
        return future

    def answer(self, index: int, status: str = "ok", device: str = "test-gpu", checks=()) -> None:
        job = self.jobs[index]
        verdict = Verdict(status=status, speedup=1.5 if status == "ok" else None, device=device,
                          task_id=job.task.id, candidate_id=job.key, checks=list(checks))
        threading.Thread(target=self.futures[index].set_result, args=(EvalResult(job, verdict, "held"),)).start()


def _store(tmp_path) -> tuple[Store, list[str]]:
    store = Store(tmp_path / "history.sqlite")
    store.add_task(TASK)
    ids = [store.add_candidate(TASK.id, code, Origin(kind="strategy", strategy="eager"))[0]
           for code in (CANDIDATE, LAYOUT_TWIN)]
    return store, ids


def test_a_source_under_way_is_waited_for_and_one_judged_is_not_sent_again(tmp_path):
    store, (first, second) = _store(tmp_path)
    pool = HeldPool()
    engine = Engine(store, pool, device_key="test-gpu", config_key="k", run_id=None)
    a = engine.submit(TASK, first, CANDIDATE)
    b = engine.submit(TASK, first, CANDIDATE)  # the same source again: waits for a
    assert len(pool.jobs) == 1 and not a.done() and not b.done()
    pool.answer(0)
    judged_a, judged_b = a.result(timeout=10), b.result(timeout=10)
    assert (judged_a.reused, judged_a.stored) == (False, True)
    assert judged_b.reused and judged_b.verdict.candidate_id == first and not judged_b.stored
    again = engine.submit(TASK, first, CANDIDATE)  # the store has it now
    assert again.done() and again.result().reused and len(pool.jobs) == 1
    assert store.verdict_for(first, "test-gpu", "k", task_id=TASK.id).status == "ok"
    assert engine.evaluations == 1 and engine.best_speedup(TASK.id) == 1.5


def test_sources_that_differ_only_in_layout_are_judged_each(tmp_path):
    store, (first, second) = _store(tmp_path)
    pool = HeldPool()
    engine = Engine(store, pool, device_key="test-gpu", config_key="k", run_id=None)
    a, b = engine.submit(TASK, first, CANDIDATE), engine.submit(TASK, second, LAYOUT_TWIN)
    assert len(pool.jobs) == 2
    pool.answer(0)
    pool.answer(1, status="incorrect")  # a twin may behave otherwise: its verdict is its own
    assert a.result(timeout=10).verdict.ok and b.result(timeout=10).verdict.status == "incorrect"
    assert not b.result().reused and store.verdict_for(second, "test-gpu", "k", task_id=TASK.id).status == "incorrect"
    assert engine.submit(TASK, second, LAYOUT_TWIN).result(timeout=10).verdict.status == "incorrect"


def _twins(tmp_path) -> tuple[Store, list[str]]:
    """A store holding the two whitespace twins, and their ids (the valid one first)."""
    assert source_id(CONTINUED_LINE) == source_id(SPACE_AFTER_BACKSLASH)  # what task ids would call one text
    store = Store(tmp_path / "history.sqlite")
    store.add_task(TASK)
    ids = [store.add_candidate(TASK.id, code, Origin(kind="manual"))[0]
           for code in (CONTINUED_LINE, SPACE_AFTER_BACKSLASH)]
    assert ids[0] != ids[1]
    return store, ids


def test_a_whitespace_twin_is_judged_on_its_own_not_given_the_verdict_under_way(tmp_path):
    store, (valid, broken) = _twins(tmp_path)
    pool = HeldPool()
    engine = Engine(store, pool, device_key="test-gpu", config_key="k", run_id=None)
    a, b = engine.submit(TASK, valid, CONTINUED_LINE), engine.submit(TASK, broken, SPACE_AFTER_BACKSLASH)
    assert [job.source for job in pool.jobs] == [CONTINUED_LINE, SPACE_AFTER_BACKSLASH]  # no follower of a
    pool.answer(0)
    pool.answer(1, status="compile_error")
    assert a.result(timeout=10).verdict.ok and b.result(timeout=10).verdict.status == "compile_error"
    assert not b.result().reused and b.result().stored
    # Once both are stored, each resubmission gets its own verdict back.
    assert engine.submit(TASK, broken, SPACE_AFTER_BACKSLASH).result(timeout=10).verdict.status == "compile_error"
    assert engine.submit(TASK, valid, CONTINUED_LINE).result(timeout=10).verdict.ok and len(pool.jobs) == 2


def test_a_whitespace_twin_is_not_given_the_stored_verdict_of_the_other(tmp_path):
    store, (valid, broken) = _twins(tmp_path)
    pool = HeldPool()
    engine = Engine(store, pool, device_key="test-gpu", config_key="k", run_id=None)
    first = engine.submit(TASK, broken, SPACE_AFTER_BACKSLASH)
    pool.answer(0, status="compile_error")
    assert first.result(timeout=10).stored
    later = engine.submit(TASK, valid, CONTINUED_LINE)  # the broken twin's failure is on file, not its own
    assert not later.done() and len(pool.jobs) == 2 and pool.jobs[1].source == CONTINUED_LINE
    pool.answer(1)
    assert later.result(timeout=10).verdict.ok and not later.result().reused


def test_an_id_that_is_not_the_codes_is_refused(tmp_path):
    store, (valid, broken) = _twins(tmp_path)
    pool = HeldPool()
    engine = Engine(store, pool, device_key="test-gpu", config_key="k", run_id=None)
    with pytest.raises(ValueError, match="not the id of the code"):
        engine.submit(TASK, valid, SPACE_AFTER_BACKSLASH).result(timeout=10)
    assert pool.jobs == []


def test_an_unknown_device_is_learnt_from_the_first_verdict(tmp_path):
    store, (first, _) = _store(tmp_path)
    pool = HeldPool()
    engine = Engine(store, pool, device_key=None, config_key="k", run_id=None)
    assert engine.best_speedup(TASK.id) is None
    a = engine.submit(TASK, first, CANDIDATE)
    pool.answer(0, device="NVIDIA H200")
    assert a.result(timeout=10).stored and engine.device_key == "NVIDIA H200"
    assert store.verdict_for(first, "NVIDIA H200", "k", task_id=TASK.id).ok
    assert engine.submit(TASK, first, CANDIDATE).result(timeout=10).reused


def test_a_stage_filing_by_verdict_device_looks_up_under_the_device_judging_now(tmp_path):
    """A training run resumed on another GPU started from its old GPU's label: it scored copies of old
    exemplars with the old GPU's speedups and never found its own verdicts again."""
    store, (first, second) = _store(tmp_path)
    old = Engine(store, HeldPool(), device_key="GPU-A", config_key="k", run_id=None, file_by_verdict_device=True)
    judged_on_a = old.submit(TASK, first, CANDIDATE)
    old.pool.answer(0, device="GPU-A")
    assert judged_on_a.result(timeout=10).stored
    pool = HeldPool()
    engine = Engine(store, pool, device_key="GPU-A", config_key="k", run_id=None, file_by_verdict_device=True)
    b = engine.submit(TASK, second, LAYOUT_TWIN)
    pool.answer(0, device="GPU-B")
    assert b.result(timeout=10).stored and engine.device_key == "GPU-B"
    assert engine.submit(TASK, second, LAYOUT_TWIN).result(timeout=10).reused  # its own verdict, found again
    again = engine.submit(TASK, first, CANDIDATE)  # judged on GPU-A only: judged on GPU-B, not given A's
    assert len(pool.jobs) == 2
    pool.answer(1, device="GPU-B")
    assert not again.result(timeout=10).reused


def test_a_training_stage_takes_its_device_label_from_its_devices_not_an_earlier_run():
    from cuda_l1.evaluate.device import device_name
    from cuda_l1.train.config_files import EvalSection
    from cuda_l1.train.eval_pool import local_device_label

    assert local_device_label(EvalSection(device="cpu")) == device_name("cpu")
    assert local_device_label(EvalSection(device="cuda", cluster="ray")) is None  # learnt from a verdict


def test_a_failing_pool_reaches_every_waiter_and_frees_the_source(tmp_path):
    store, (first, _) = _store(tmp_path)
    pool = HeldPool()
    engine = Engine(store, pool, device_key="test-gpu", config_key="k", run_id=None)
    a, b = engine.submit(TASK, first, CANDIDATE), engine.submit(TASK, first, CANDIDATE)
    pool.futures[0].set_exception(RuntimeError("worker lost"))
    for future in (a, b):
        with pytest.raises(RuntimeError, match="worker lost"):
            future.result(timeout=10)
    engine.submit(TASK, first, CANDIDATE)  # tried again: a new evaluation
    assert len(pool.jobs) == 2


@pytest.mark.slow
def test_real_evaluations_through_a_local_pool(tmp_path):
    store, (first, second) = _store(tmp_path)
    valid, broken = [store.add_candidate(TASK.id, code, Origin(kind="manual"))[0]
                     for code in (CONTINUED_LINE, SPACE_AFTER_BACKSLASH)]
    timing = TimingConfig.quick()
    timing.max_time_s = 1.0
    config = EvalConfig(device="cpu", timing=timing, correctness_trials=2)
    with LocalPool("cpu", config, workers=1) as pool:
        engine = Engine(store, pool, device_key="cpu-test", config_key=config.config_key(), run_id=None)
        results = [engine.submit(TASK, cid, code).result(timeout=300)
                   for cid, code in ((first, CANDIDATE), (first, CANDIDATE), (second, LAYOUT_TWIN))]
        # Whitespace twins in flight together: each is evaluated, and the broken one fails on its own.
        twins = [engine.submit(TASK, valid, CONTINUED_LINE), engine.submit(TASK, broken, SPACE_AFTER_BACKSLASH)]
        twins = [f.result(timeout=300) for f in twins]
    assert [r.verdict.status for r in results] == ["ok"] * 3 and [r.reused for r in results] == [False, True, False]
    assert [t.verdict.status for t in twins] == ["ok", "compile_error"] and not any(t.reused for t in twins)
    assert [t.verdict.candidate_id for t in twins] == [valid, broken]
    assert store.verdict_for(broken, "cpu-test", config.config_key(), task_id=TASK.id).status == "compile_error"
    assert engine.evaluations == 4


class RefusingPool:
    def submit(self, job):
        raise RuntimeError("no workers left")


def test_a_pool_that_refuses_frees_the_program_for_the_next_try(tmp_path):
    store, (first, second) = _store(tmp_path)
    engine = Engine(store, RefusingPool(), device_key="test-gpu", config_key="k", run_id=None)
    with pytest.raises(RuntimeError, match="no workers left"):
        engine.submit(TASK, first, CANDIDATE).result(timeout=10)
    with pytest.raises(RuntimeError, match="no workers left"):  # not a follower of a dead evaluation
        engine.submit(TASK, first, CANDIDATE).result(timeout=10)


def test_a_pool_closed_before_judging_stores_nothing(tmp_path):
    from cuda_l1.evaluate.jobs import NO_WORKER, failed_verdict

    store, (first, _) = _store(tmp_path)
    pool = HeldPool()
    engine = Engine(store, pool, device_key="test-gpu", config_key="k", run_id=None)
    future = engine.submit(TASK, first, CANDIDATE)
    job = pool.jobs[0]
    pool.futures[0].set_result(EvalResult(job, failed_verdict(job, "the pool was closed"), NO_WORKER))
    judged = future.result(timeout=10)
    assert judged.verdict.status == "runtime_error" and not judged.stored
    assert store.verdict_for(first, "test-gpu", "k", task_id=TASK.id) is None  # judged again on resume


@pytest.mark.parametrize("failed_check", ["evaluator", "reference_ran", "gpu_health_after"])
def test_a_failure_of_the_evaluation_itself_is_judged_again_not_reused(tmp_path, failed_check):
    store, (first, second) = _store(tmp_path)
    pool = HeldPool()
    engine = Engine(store, pool, device_key="test-gpu", config_key="k", run_id=None)
    a = engine.submit(TASK, first, CANDIDATE)
    pool.answer(0, status="runtime_error", checks=[Check(failed_check, False, "the harness failed")])
    assert a.result(timeout=10).stored and not a.result().verdict.settled
    again = engine.submit(TASK, first, CANDIDATE)  # its stored verdict is not a finding about it
    follower = engine.submit(TASK, first, CANDIDATE)
    assert len(pool.jobs) == 2 and not again.done() and not follower.done()
    pool.answer(1)
    assert again.result(timeout=10).verdict.ok and not again.result().reused
    assert follower.result(timeout=10).reused and follower.result().verdict.ok
    # The second evaluation's verdict replaced the unsettled one: it is what stands from now on.
    stored = store.verdict_for(first, "test-gpu", "k", task_id=TASK.id)
    assert again.result().stored and stored.ok and stored.attempts == 2
    assert engine.submit(TASK, first, CANDIDATE).result(timeout=10).reused and len(pool.jobs) == 2


def test_an_evaluation_failure_that_recurs_stands_after_three_tries(tmp_path):
    # A program that makes every evaluation of it fail (it crashes the reference beside it, say)
    # would otherwise be evaluated again at every submission: RL resubmits the same text often.
    from cuda_l1.engine import UNSETTLED_TRIES

    store, (first, _) = _store(tmp_path)
    pool = HeldPool()
    engine = Engine(store, pool, device_key="test-gpu", config_key="k", run_id=None)
    for attempt in range(UNSETTLED_TRIES):
        future = engine.submit(TASK, first, CANDIDATE)
        pool.answer(attempt, status="runtime_error", checks=[Check("reference_ran", False, "it died beside it")])
        assert not future.result(timeout=10).reused and len(pool.jobs) == attempt + 1
    again = engine.submit(TASK, first, CANDIDATE)
    assert again.done() and again.result().reused and len(pool.jobs) == UNSETTLED_TRIES
    assert again.result().verdict.status == "runtime_error" and not again.result().verdict.settled


def test_a_failure_the_candidate_caused_stands(tmp_path):
    store, (first, second) = _store(tmp_path)
    pool = HeldPool()
    engine = Engine(store, pool, device_key="test-gpu", config_key="k", run_id=None)
    a = engine.submit(TASK, first, CANDIDATE)
    pool.answer(0, status="runtime_error", checks=[Check("runs_to_completion", False, "it raised")])
    assert a.result(timeout=10).verdict.settled
    again = engine.submit(TASK, first, CANDIDATE)
    assert again.done() and again.result().reused and len(pool.jobs) == 1


# Two sources with one normalised hash that compile to different programs: in the first, a lone `\`
# continues `CHEAT = True` into the method's body; in the second it runs at module level.
CONTINUED = CANDIDATE + "\n    def _unused(self):\n        pass\n\\\n        CHEAT = True\n"
AT_MODULE_LEVEL = CANDIDATE + "\n    def _unused(self):\n        pass\nCHEAT = True\n"


def test_sources_with_one_normalised_hash_are_judged_each(tmp_path):
    from cuda_l1.store import norm_hash

    assert norm_hash(CONTINUED) == norm_hash(AT_MODULE_LEVEL)  # grouped in listings, never in verdicts
    store = Store(tmp_path / "history.sqlite")
    store.add_task(TASK)
    ids = [store.add_candidate(TASK.id, c, Origin(kind="strategy", strategy="eager"))[0]
           for c in (CONTINUED, AT_MODULE_LEVEL)]
    pool = HeldPool()
    engine = Engine(store, pool, device_key="test-gpu", config_key="k", run_id=None)
    first = engine.submit(TASK, ids[0], CONTINUED)
    pool.answer(0)
    assert first.result(timeout=10).verdict.ok
    second = engine.submit(TASK, ids[1], AT_MODULE_LEVEL)
    assert not second.done() and len(pool.jobs) == 2 and pool.jobs[1].source == AT_MODULE_LEVEL
