"""From completions to verdicts: parse, record, evaluate (once per distinct program), record again.

Every stage turns LLM answers into training signal the same way, so this is the one place where a
completion meets the evaluator and the history store:

    completion text -> parse_completion -> candidate (store) -> engine -> pool (sandboxed) -> verdict (store)

The process that owns a Judge is the only writer of the store. Identical programs (the same code up
to comments and layout) are evaluated once per batch, and a program the store already judged on the
same device under the same settings is not evaluated again: GRPO groups and repeated sampling produce
many duplicates, and each evaluation costs seconds of device time (the engine's rule, engine.py).
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from cuda_l1.contrastive import parse_completion
from cuda_l1.engine import UNSETTLED_TRIES, Engine
from cuda_l1.errors import RunError
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.jobs import EvalPool
from cuda_l1.evaluate.verdict import OK, PARSE_ERROR, Verdict
from cuda_l1.store import Origin, Store
from cuda_l1.tasks import Task
from cuda_l1.text import encodable


@dataclass
class Attempt:
    """One completion to judge, with where it came from."""

    task: Task
    text: str  # the model's whole answer
    prompt_id: int | None = None  # store id of the prompt that produced it (record_prompt)
    model: str = ""  # model that wrote it
    endpoint: str = ""  # endpoint / engine it came from
    exemplar_ids: list[str] = field(default_factory=list)  # candidates the prompt showed
    finish_reason: str | None = None  # "stop", "length", ...
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    origin_kind: str = "llm"  # store origin kind ("import": supplied from a file; "strategy": an offline strategy)
    strategy: str = ""  # offline strategy name when origin_kind is "strategy"


@dataclass
class Outcome:
    """What the evaluator (or the parser) said about one attempt."""

    attempt: Attempt
    status: str  # a verdict status, or parse_error
    speedup: float | None = None  # set when status is ok and timing ran
    code: str | None = None  # the module that was evaluated
    analysis: str = ""  # the answer's text outside code blocks
    candidate_id: str | None = None
    verdict: Verdict | None = None
    reused: bool = False  # the verdict came from an earlier evaluation of the same program
    error: str = ""  # parse error message

    @property
    def ok(self) -> bool:
        return self.status == OK


Progress = Callable[[int], None]  # called with the number of attempts just settled


class Judge:
    """Parse and record completions, and judge their candidates through the engine (engine.py)."""

    def __init__(self, store: Store, pool: EvalPool, config: EvalConfig, run_id: int | None,
                 device_label: str | None = None):
        self.store = store
        self.pool = pool
        self.config = config
        self.config_key = config.config_key()
        self.run_id = run_id
        # device_label: the device name verdicts carry (e.g. "NVIDIA H200"); None: learnt from the first.
        self.engine = Engine(store, pool, device_key=device_label, config_key=self.config_key, run_id=run_id,
                             file_by_verdict_device=True)

    @property
    def device_label(self) -> str | None:
        return self.engine.device_key

    @property
    def evaluations(self) -> int:
        """Programs actually sent to the evaluator."""
        return self.engine.evaluations

    def best_speedup(self, task_id: str) -> float | None:
        """The best verified speedup on this device under these settings (for the re-measure rule):
        speedups timed with other settings do not compare."""
        return self.engine.best_speedup(task_id)

    def _record_completion(self, attempt: Attempt, status: str, message: str = "",
                           candidate_id: str | None = None) -> None:
        if attempt.prompt_id is None:
            return
        self.store.record_completion(
            attempt.prompt_id, attempt.text, endpoint=attempt.endpoint, model=attempt.model,
            prompt_tokens=attempt.prompt_tokens, completion_tokens=attempt.completion_tokens,
            latency_s=attempt.latency_s, finish_reason=attempt.finish_reason, parse_status=status,
            parse_message=message, candidate_id=candidate_id)

    def judge(self, attempts: list[Attempt], progress: Progress | None = None) -> list[Outcome]:
        """Outcomes in the order of `attempts`. Blocks until every needed evaluation is done."""
        outcomes: list[Outcome] = []
        waiting: list[tuple[Outcome, Future]] = []
        settled = 0
        for attempt in attempts:
            attempt.text = encodable(attempt.text)  # (a lone surrogate: the store holds UTF-8 only)
            parsed = parse_completion(attempt.text)
            if not parsed.ok:
                self._record_completion(attempt, PARSE_ERROR, parsed.error)
                outcomes.append(Outcome(attempt, PARSE_ERROR, analysis=parsed.analysis, error=parsed.error))
                settled += 1
                continue
            code = parsed.code
            origin = Origin(kind=attempt.origin_kind, strategy=attempt.strategy, model=attempt.model,
                            prompt_id=attempt.prompt_id, parent_ids=list(attempt.exemplar_ids))
            candidate_id, _ = self.store.add_candidate(attempt.task.id, code, origin, run_id=self.run_id)
            self._record_completion(attempt, OK, candidate_id=candidate_id)
            outcome = Outcome(attempt, PARSE_ERROR, code=code, analysis=parsed.analysis, candidate_id=candidate_id)
            outcomes.append(outcome)
            future = self.engine.submit(attempt.task, candidate_id, code,
                                        best_known=self.best_speedup(attempt.task.id))
            waiting.append((outcome, future))
        if progress and settled:
            progress(settled)
        for tries in range(1, UNSETTLED_TRIES + 1):
            again: list[tuple[Outcome, Future]] = []
            for outcome, future in waiting:
                judged = future.result()
                if not judged.judged:  # the pool closed or gave up: no reward can be had, none is made up
                    raise RunError(f"the evaluation pool answered without judging "
                                   f"({'; '.join(judged.verdict.reasons) or judged.verdict.status})")
                if not judged.verdict.settled and tries < UNSETTLED_TRIES:
                    # The evaluation itself failed (its reference, the device, the evaluator): nothing
                    # said of the program, so it is judged again, as the engine would on a later
                    # submission; only a failure that recurs UNSETTLED_TRIES times stands (and is scored).
                    again.append((outcome, self.engine.submit(outcome.attempt.task, outcome.candidate_id,
                                                              outcome.code, best_known=self.best_speedup(
                                                                  outcome.attempt.task.id))))
                    continue
                self._settle(outcome, judged.verdict, reused=judged.reused)
                if progress:
                    progress(1)
            waiting = again
        return outcomes

    @staticmethod
    def _settle(outcome: Outcome, verdict: Verdict, reused: bool) -> None:
        outcome.status = verdict.status
        outcome.verdict = verdict
        outcome.reused = reused
        speedup = verdict.speedup
        outcome.speedup = float(speedup) if verdict.ok and speedup is not None and math.isfinite(speedup) else None


def rates(outcomes: list[Outcome]) -> dict[str, float]:
    """Per-batch rates every stage logs: parse, compile (the module imported), executability, correctness.

    compile_rate: the module parsed and imported (not parse_error / compile_error);
    exec_rate: it also ran to completion on the evaluator's inputs (ok or incorrect);
    correct_rate: ok (correct, and not a refused hack); rejected_rate: refused hacks.
    """
    n = len(outcomes)
    if n == 0:
        return {"count": 0}
    status = [o.status for o in outcomes]
    speedups = [o.speedup for o in outcomes if o.ok and o.speedup is not None]
    out = {
        "count": n,
        "parse_rate": sum(s != PARSE_ERROR for s in status) / n,
        "compile_rate": sum(s not in (PARSE_ERROR, "compile_error") for s in status) / n,
        "exec_rate": sum(s in (OK, "incorrect") for s in status) / n,
        "correct_rate": sum(s == OK for s in status) / n,
        "rejected_rate": sum(s == "rejected" for s in status) / n,
    }
    if speedups:
        out["mean_speedup"] = sum(speedups) / len(speedups)
        out["geomean_speedup"] = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        out["best_speedup"] = max(speedups)
    return out
