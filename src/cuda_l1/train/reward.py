"""Stage 3's reward: the evaluator's verdict on each completion, shaped into one number.

Shaping (RewardConfig defaults in brackets):

    ok, timed            ln(speedup), clipped to [-ln C, +ln C]               [C = 10: -2.30 .. +2.30]
    ok, not timed        unmeasured_reward                                     [0.0]
    incorrect, compile_error, runtime_error, timeout, parse_error
                         failure_reward                                        [-3.0]
    rejected             hack_reward                                           [-5.0]

Why this shape:
- The log makes the reward symmetric in ratio terms (2x and 0.5x are equally far from 1x) and is the
  same scale the contrastive sampler scores buckets on. A raw speedup would let one 40x outlier (a
  timing artefact or an undetected exploit) dominate the group's advantages; the clip bounds it further.
- Every failure scores below every correct candidate (failure_reward < -ln C, checked at load time),
  so correctness always comes first; among correct candidates, faster is better.
- A refused hack (the evaluator caught timer or stream tricks, cached outputs, patched torch, ...)
  scores below an honest failure. The paper found that, unchecked, a third of RL kernels exploited
  the timer; a hack must be the worst thing the policy can do, not a near miss.
- Failures share one constant: a compile error and a wrong answer are both "no kernel", and ranking
  them would teach the policy to prefer code that merely compiles.
GRPO normalises rewards within each group, so what matters is this ordering and the relative gaps.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from cuda_l1.errors import RunError, UserError
from cuda_l1.evaluate.verdict import ALL_STATUSES, OK, REJECTED
from cuda_l1.settings import setting
from cuda_l1.train.attempts import Attempt, Judge, rates
from cuda_l1.train.distributed import Collective
from cuda_l1.train.metrics import MetricsLog


@dataclass
class RewardConfig:
    """Reward shaping: verdict -> scalar reward."""

    speedup_clip: float = setting(10.0, "ok: reward = ln(speedup) clipped to [-ln(clip), +ln(clip)]")
    failure_reward: float = setting(-3.0, "incorrect, compile_error, runtime_error, timeout and parse_error")
    hack_reward: float = setting(-5.0, "rejected: the evaluator refused a hack; kept below failure_reward")
    unmeasured_reward: float = setting(0.0, "ok but not timed (timing disabled): correct, speed unknown")

    def validate(self) -> None:
        if not (self.speedup_clip > 1 and math.isfinite(self.speedup_clip)):
            raise UserError(f"[reward] speedup_clip must be a finite number above 1 (got {self.speedup_clip}).")
        floor = -math.log(self.speedup_clip)
        if not self.failure_reward < min(floor, self.unmeasured_reward):
            raise UserError(f"[reward] failure_reward ({self.failure_reward}) must be below every correct "
                            f"candidate's reward (below {min(floor, self.unmeasured_reward):.3f} = -ln(speedup_clip)).")
        if not self.hack_reward < self.failure_reward:
            raise UserError(f"[reward] hack_reward ({self.hack_reward}) must be below failure_reward "
                            f"({self.failure_reward}): a refused hack is the worst outcome.")


def shape_reward(status: str, speedup: float | None, config: RewardConfig | None = None) -> float:
    """The reward for one verdict (see the module docstring)."""
    config = config or RewardConfig()
    if status not in ALL_STATUSES:
        raise ValueError(f"unknown verdict status {status!r}")
    if status == OK:
        if speedup is None or not math.isfinite(speedup) or speedup <= 0:
            return config.unmeasured_reward
        bound = math.log(config.speedup_clip)
        return max(-bound, min(bound, math.log(speedup)))
    if status == REJECTED:
        return config.hack_reward
    return config.failure_reward


def completion_text(completion: Any) -> str:
    """TRL passes conversational completions as message lists, plain ones as strings."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(m.get("content") or "" for m in completion if isinstance(m, dict))
    return str(completion)


class EvaluatorReward:
    """A TRL reward function: judge every completion on rank 0, write verdicts to the store, shape rewards.

    Only rank 0 holds the store and the evaluation pool (the store has one writer; other ranks may be
    on other hosts). Every rank sends its completions to rank 0 and gets its rewards back, so the
    call is collective: TRL calls reward functions on all ranks at the same point of each step.
    """

    __name__ = "cuda_l1_evaluator"  # TRL logs rewards under the function's name

    def __init__(self, judge: Judge | None, tasks: dict, config: RewardConfig, collective: Collective,
                 model_name: str = "", metrics: MetricsLog | None = None):
        self.judge = judge  # None on every rank but 0
        self.tasks = tasks  # task id -> Task
        self.config = config
        self.collective = collective
        self.model_name = model_name
        self.metrics = metrics
        self.calls = 0

    def _score(self, items: list[dict]) -> tuple[list[float], dict]:
        attempts = [Attempt(self.tasks[i["task_id"]], i["text"], i["prompt_id"], model=self.model_name,
                            endpoint="policy", exemplar_ids=list(i["exemplar_ids"] or [])) for i in items]
        started = time.monotonic()
        outcomes = self.judge.judge(attempts)
        judge_s = time.monotonic() - started  # training waits this long for the evaluator
        rewards = [shape_reward(o.status, o.speedup, self.config) for o in outcomes]
        stats = rates(outcomes)
        stats["reward_mean"] = sum(rewards) / len(rewards) if rewards else 0.0
        stats["evaluations"] = self.judge.evaluations
        stats["judge_s"] = judge_s
        statuses: dict[str, int] = {}
        for o in outcomes:
            statuses[o.status] = statuses.get(o.status, 0) + 1
        stats["statuses"] = statuses
        stats["samples"] = [{"task_id": o.attempt.task.id, "candidate_id": o.candidate_id, "status": o.status,
                             "speedup": o.speedup, "reward": r, "reused": o.reused} for o, r in zip(outcomes, rewards)]
        return rewards, stats

    def __call__(self, prompts, completions, task_id, prompt_id=None, exemplar_ids=None, trainer_state=None,
                 log_metric=None, **_: Any) -> list[float]:
        count = len(completions)
        local = [{"task_id": task_id[i], "text": completion_text(completions[i]),
                  "prompt_id": prompt_id[i] if prompt_id is not None else None,
                  "exemplar_ids": exemplar_ids[i] if exemplar_ids is not None else []} for i in range(count)]
        per_rank = self.collective.all_gather(local)
        payload, failure = None, None
        if self.collective.is_main:
            try:
                rewards, stats = self._score([item for rank_items in per_rank for item in rank_items])
                # The optimizer step these completions train (TRL logs their metrics, and TensorBoard
                # files them, under the step number after the update: 1 for the first).
                step = getattr(trainer_state, "global_step", self.calls) + 1
                if self.metrics is not None:
                    self.metrics.log(step, {k: v for k, v in stats.items()}, prefix="cuda_l1/")
                payload = (rewards, stats)
            except Exception as exc:  # noqa: BLE001 - every rank stops with it, none waits in the broadcast
                failure, payload = exc, ("failed", f"{type(exc).__name__}: {exc}")
        payload = self.collective.broadcast(payload)
        if failure is not None:
            raise failure
        if payload[0] == "failed":
            raise RunError(f"rank 0 could not judge this step's completions ({payload[1]})")
        rewards, stats = payload
        self.calls += 1
        if log_metric is not None:  # averaged over ranks by TRL; every rank logs the same values
            for key, value in sorted(stats.items()):
                if isinstance(value, (int, float)) and key != "count":
                    log_metric(f"cuda_l1/{key}", float(value))
        start = sum(len(items) for items in per_rank[: self.collective.rank])
        return rewards[start:start + count]
