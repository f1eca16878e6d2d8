"""The training stages' judge: an evaluation that says nothing of the program is never turned into the
program's reward (judged again, or the run stops), and what the store holds is reused under the device
judging now."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from cuda_l1.errors import RunError
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.jobs import NO_WORKER, EvalPool, EvalResult
from cuda_l1.evaluate.verdict import Check, Verdict
from cuda_l1.store import Store
from cuda_l1.tasks import Task, code_id
from cuda_l1.train.attempts import Attempt, Judge
from cuda_l1.train.reward import RewardConfig, shape_reward

REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16)]


def get_init_inputs():
    return []
'''
TASK = Task(name="1_ReLU", level=1, source=REFERENCE)
CODE = REFERENCE.replace("class Model(", "class ModelNew(").split("\n\ndef get_inputs")[0] + "\n"
ANSWER = f"Same as the reference.\n```python\n{CODE}```\n"


class ScriptedPool(EvalPool):
    """Answers the n-th job with the n-th scripted (verdict kind, worker); the last one repeats."""

    def __init__(self, script: list[tuple[str, str]]):
        self.script, self.jobs, self.workers = script, [], ["scripted"]

    def submit(self, job) -> Future:
        kind, worker = self.script[min(len(self.jobs), len(self.script) - 1)]
        self.jobs.append(job)
        checks = [Check("reference_ran", False, "the reference's side died")] if kind == "evaluation_failed" else []
        verdict = Verdict(status="ok" if kind == "ok" else "runtime_error", speedup=2.0 if kind == "ok" else None,
                          device="GPU-X", task_id=job.task.id, candidate_id=code_id(job.source), checks=checks,
                          reasons=[] if kind == "ok" else [f"{kind} (scripted)"])
        future: Future = Future()
        future.set_result(EvalResult(job, verdict, worker))
        return future

    def close(self) -> None:
        pass


def judge_with(tmp_path, script) -> tuple[Judge, ScriptedPool]:
    store = Store(tmp_path / "history.sqlite")
    store.add_task(TASK)
    pool = ScriptedPool(script)
    return Judge(store, pool, EvalConfig(), run_id=None, device_label="GPU-X"), pool


def test_a_failed_evaluation_is_judged_again_and_its_program_scored_on_what_it_did(tmp_path):
    """One evaluation whose reference died was scored -3 for a correct program (a group's advantages
    pushed away from correct code at random)."""
    judge, pool = judge_with(tmp_path, [("evaluation_failed", "w0"), ("ok", "w0")])
    [outcome] = judge.judge([Attempt(TASK, ANSWER)])
    assert outcome.status == "ok" and outcome.speedup == 2.0 and len(pool.jobs) == 2
    assert shape_reward(outcome.status, outcome.speedup, RewardConfig()) > 0


def test_a_failure_of_the_evaluation_that_recurs_stands_after_three_tries(tmp_path):
    judge, pool = judge_with(tmp_path, [("evaluation_failed", "w0")])
    [outcome] = judge.judge([Attempt(TASK, ANSWER)])
    assert outcome.status == "runtime_error" and len(pool.jobs) == 3  # a program that kills every evaluation


def test_a_pool_that_answers_without_judging_stops_the_run_instead_of_scoring_the_program(tmp_path):
    """A Ray pool that became unusable answered every later completion with a failed verdict, and
    training went on with -3 for each."""
    judge, pool = judge_with(tmp_path, [("the pool was closed", NO_WORKER)])
    with pytest.raises(RunError, match="without judging"):
        judge.judge([Attempt(TASK, ANSWER)])
    assert len(pool.jobs) == 1


class TwoRanks:
    """One side of a two-process collective whose rank 0 answer the test holds (what broadcast carries)."""

    world_size = 2

    def __init__(self, rank: int, sent: list):
        self.rank, self.sent = rank, sent

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather(self, obj):
        return [obj, []] if self.rank == 0 else [[], obj]

    def broadcast(self, obj):
        if self.rank == 0:
            self.sent.append(obj)
            return obj
        return self.sent[-1]


def test_a_step_rank_0_cannot_judge_stops_every_rank_rather_than_leaving_them_in_the_broadcast(tmp_path):
    from cuda_l1.train.reward import EvaluatorReward

    judge, _ = judge_with(tmp_path, [("the pool was closed", NO_WORKER)])
    sent: list = []
    main = EvaluatorReward(judge, {TASK.id: TASK}, RewardConfig(), TwoRanks(0, sent))
    with pytest.raises(RunError, match="without judging"):
        main(prompts=["p"], completions=[ANSWER], task_id=[TASK.id])
    assert sent and sent[-1][0] == "failed"  # the other ranks were told, not left waiting
    other = EvaluatorReward(None, {TASK.id: TASK}, RewardConfig(), TwoRanks(1, sent))
    with pytest.raises(RunError, match="rank 0 could not judge"):
        other(prompts=["p"], completions=[ANSWER], task_id=[TASK.id])


def test_a_lone_surrogate_is_a_clear_error_in_a_file_and_no_crash_in_a_completion(tmp_path):
    """A JSON line holding "\\ud800" in extra completions crashed a self-improve round in the store,
    after its sampling was done."""
    from cuda_l1.errors import UserError
    from cuda_l1.train.self_improve_trainer import read_extra_completions

    extra = tmp_path / "extra.jsonl"
    extra.write_text('{"task": "%s", "text": "x = \\"\\ud800\\""}\n' % TASK.id)
    with pytest.raises(UserError, match=r"extra.jsonl:1: .*lone surrogate"):
        read_extra_completions(str(extra), [TASK])
    judge, _ = judge_with(tmp_path, [("ok", "w0")])
    store = judge.store
    prompt = store.record_prompt(TASK.id, "a prompt")
    [outcome] = judge.judge([Attempt(TASK, ANSWER.replace("Same as", "Same \ud800 as"), prompt)])
    assert outcome.status == "ok"
