"""The steady-state optimisation loop: ask, parse, record, evaluate, record, ask again.

One asyncio event loop in the process that owns the store. Each task has `per_task` workers; each
worker repeats one *attempt* while the task has budget left:

    exemplars (store, sampler) + recent failures -> build_prompt -> record_prompt
    -> await LLM -> record_completion -> parse -> add_candidate -> evaluate (pool) -> record_verdict

A semaphore bounds the attempts in flight across tasks (`concurrency`), so while one task's candidate
is being evaluated another task's request is with the model: LLM latency and evaluation overlap.
Evaluations run in the pool's worker processes; their concurrent futures are bridged into asyncio.

Budget: one unit per completion recorded for the task in this run, usable or not. A request is
started only while `spent + requests in flight < budget`, and `spent` goes up in the same step that
records the completion, so a task never gets more completions than its budget, even across a kill
and a rerun (the rerun counts what the store holds). A failed request (the endpoint's error after
its retries) records nothing and costs no budget; too many in a row stop the task, or the run.

Duplicates: a program (normalised code) is evaluated once per task, device and settings (the engine's
rule, engine.py): one that the store has judged is not sent again, one under way is waited for.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from cuda_l1.contrastive import build_prompt, parse_completion, sample_exemplars
from cuda_l1.engine import Engine
from cuda_l1.evaluate.verdict import OK, PARSE_ERROR, Verdict
from cuda_l1.search.search_config import SearchConfig
from cuda_l1.search.display import Display
from cuda_l1.search.ledger import EventLog
from cuda_l1.store import CandidateRecord, Origin, Store
from cuda_l1.store.records import origin_label
from cuda_l1.tasks import Task


@dataclass
class TaskState:
    """Where one task stands in this run."""

    task: Task
    budget: int  # completions this run may record for the task
    spent: int = 0  # completions recorded for the task in this run (resumed runs start from the store)
    requesting: int = 0  # LLM requests in flight
    evaluating: int = 0  # candidates being evaluated now
    parse_errors: int = 0  # unusable completions in this run
    evaluated: int = 0  # evaluations this process ran for the task
    reused: int = 0  # candidates whose program had been judged already (not evaluated again)
    failed_requests: int = 0  # consecutive failed LLM requests for this task
    best: float | None = None  # best verified speedup known on this device
    best_origin: str = ""  # who wrote the best candidate ("compile", "llm:model", ...)
    last: str = ""  # what happened last, for the progress table
    rng: random.Random = field(default_factory=random.Random)  # exemplar draws

    def may_ask(self) -> bool:
        return self.spent + self.requesting < self.budget


class Search:
    """One run of the loop over some tasks; `await run(pending)` returns when every budget is spent."""

    def __init__(self, *, store: Store, run_id: int, states: list[TaskState], client: Any, engine: Engine,
                 device: str, config_key: str, config: SearchConfig, events: EventLog, display: Display):
        self.store = store
        self.run_id = run_id
        self.states = states
        self.by_task = {st.task.id: st for st in states}
        self.client = client  # ChatClient or None (then only pending evaluations run)
        self.engine = engine  # judges each program once and stores every verdict (engine.py)
        self.device = device  # the device name verdicts are filed under; also the GPU named in prompts
        self.config_key = config_key
        self.config = config
        self.events = events
        self.display = display
        self.stopped: str | None = None  # why the run stopped early, if it did
        self.evaluations = 0  # evaluations this process ran
        self.reused = 0  # candidates not evaluated because their program had been judged
        self._failed_requests = 0  # consecutive failed requests, all tasks together

    async def run(self, pending: list[CandidateRecord] = ()) -> None:
        """Evaluate candidates a killed run left unjudged, then spend every task's budget."""
        slots = asyncio.Semaphore(self.config.concurrency)
        async with asyncio.TaskGroup() as group:
            for record in pending:
                st = self.by_task.get(record.task_id)
                if st is not None:
                    group.create_task(self._evaluate(st, record.candidate_id, record.code, record.origin))
            if self.client is not None:
                for st in self.states:
                    for _ in range(self.config.per_task):
                        group.create_task(self._task_worker(st, slots))

    # -- one task -----------------------------------------------------------------------------------

    def _may_ask(self, st: TaskState) -> bool:
        return (self.stopped is None and st.may_ask()
                and st.failed_requests < self.config.max_request_failures)

    async def _task_worker(self, st: TaskState, slots: asyncio.Semaphore) -> None:
        while self._may_ask(st):
            async with slots:
                if not self._may_ask(st):  # the budget may have been taken while waiting for a slot
                    break
                await self._attempt(st)
        if st.failed_requests >= self.config.max_request_failures and st.may_ask():
            self._show(st, "gave up: requests keep failing")

    async def _attempt(self, st: TaskState) -> None:
        st.requesting += 1
        try:
            prompt_id, messages, exemplar_ids = self._prompt(st)
            self._show(st, "asking the model")
            answers = await self.client.complete(messages, n=1)
        finally:
            st.requesting -= 1
        # From here to the evaluation nothing awaits: the completion is recorded and counted in one step.
        answer = answers[0]
        if not answer.ok:
            self._request_failed(st, answer.error)
            return
        st.failed_requests = self._failed_requests = 0
        candidate = self._record_answer(st, prompt_id, exemplar_ids, answer)
        if candidate is not None:
            cid, code, origin = candidate
            await self._evaluate(st, cid, code, origin)

    def _prompt(self, st: TaskState) -> tuple[int, list[dict], list[str]]:
        task = st.task
        known = self.store.correct_candidates(task.id, device=self.device, config_key=self.config_key)
        exemplars = sample_exemplars(known, self.config.sampler, st.rng)
        failures = self.store.recent_failures(task.id, n=self.config.max_failures, device=self.device)
        messages = build_prompt(task.source, exemplars, failures, self.device, task_name=task.name,
                                max_failures=self.config.max_failures)
        exemplar_ids = [e.candidate_id for e in exemplars]
        prompt_id = self.store.record_prompt(task.id, messages, exemplar_ids, run_id=self.run_id)
        return prompt_id, messages, exemplar_ids

    def _request_failed(self, st: TaskState, error: str | None) -> None:
        st.failed_requests += 1
        self._failed_requests += 1
        self.events.write("request_failed", task=st.task.key, error=error)
        self._show(st, f"request failed: {error}")
        if self._failed_requests >= self.config.max_request_failures and self.stopped is None:
            self.stopped = (f"{self._failed_requests} LLM requests in a row failed; the last error: {error}. "
                            "Check the endpoint, then rerun the same command to continue.")
            self.events.write("stopped", reason=self.stopped)

    def _record_answer(self, st: TaskState, prompt_id: int, exemplar_ids: list[str],
                       answer) -> tuple[str, str, dict] | None:
        """Record the completion (and its candidate when it holds one); count it against the budget."""
        task = st.task
        accounting = dict(endpoint=answer.endpoint, model=answer.model, prompt_tokens=answer.prompt_tokens,
                          completion_tokens=answer.completion_tokens, latency_s=answer.latency_s,
                          cost=answer.cost, finish_reason=answer.finish_reason)
        parsed = parse_completion(answer.text)
        if not parsed.ok:
            message = parsed.error
            if answer.finish_reason == "length" and "token limit" not in message:
                message += " The answer stopped at the token limit (finish_reason=length)."
            self.store.record_completion(prompt_id, answer.text, parse_status=PARSE_ERROR, parse_message=message,
                                         **accounting)
            st.spent += 1
            st.parse_errors += 1
            self.events.write("completion", task=task.key, prompt_id=prompt_id, parse_status=PARSE_ERROR,
                              finish_reason=answer.finish_reason, message=message)
            self._show(st, "parse_error: no usable code")
            return None
        origin = Origin(kind="llm", model=answer.model, prompt_id=prompt_id, parent_ids=list(exemplar_ids))
        cid, _ = self.store.add_candidate(task.id, parsed.code, origin, run_id=self.run_id)
        self.store.record_completion(prompt_id, answer.text, parse_status=OK, candidate_id=cid, **accounting)
        st.spent += 1
        self.events.write("completion", task=task.key, prompt_id=prompt_id, parse_status=OK, candidate_id=cid,
                          finish_reason=answer.finish_reason, parents=list(exemplar_ids))
        return cid, parsed.code, {"kind": "llm", "model": answer.model}

    # -- evaluation ---------------------------------------------------------------------------------

    async def _evaluate(self, st: TaskState, cid: str, code: str, origin: dict) -> None:
        task = st.task
        st.evaluating += 1
        self._show(st, "evaluating")
        try:
            # shield: cancelling this coroutine must not cancel the engine's future, which the pool's
            # own thread resolves later (and other candidates of the same program may wait on).
            submitted = self.engine.submit(task, cid, code, best_known=st.best, thresholds=self._thresholds(st))
            judged = await asyncio.shield(asyncio.wrap_future(submitted))
        finally:
            st.evaluating -= 1
        if judged.reused:
            self._reuse(st, cid, judged.verdict)
            return
        verdict = judged.verdict
        self.evaluations += 1
        st.evaluated += 1
        self.events.write("verdict", task=task.key, candidate_id=cid, origin=origin_label(origin),
                          status=verdict.status, speedup=verdict.speedup, new=judged.stored)
        self._note_verdict(st, verdict, origin)
        self.display.refresh()

    def _thresholds(self, st: TaskState) -> tuple[float, ...]:
        """What the loop decides with a speedup: its exemplar bucket (the sampler's edges) and whether it
        beats the task's best so far; timing may stop once the interval is clear of all of them."""
        edges = set(self.config.sampler.bucket_edges) | {1.0}
        if st.best is not None:
            edges.add(st.best)
        return tuple(sorted(edges))

    def _reuse(self, st: TaskState, cid: str, verdict: Verdict) -> None:
        st.reused += 1
        self.reused += 1
        self.events.write("reused", task=st.task.key, candidate_id=cid, judged=verdict.candidate_id,
                          status=verdict.status, speedup=verdict.speedup)
        self._show(st, f"duplicate of a judged program ({verdict.status})")

    def _note_verdict(self, st: TaskState, verdict: Verdict, origin: dict) -> None:
        speedup = verdict.speedup if verdict.ok else None
        if speedup is not None and (st.best is None or speedup > st.best):
            st.best, st.best_origin = speedup, origin_label(origin)
        self._show(st, verdict.status + (f" {speedup:.2f}x" if speedup is not None else ""))

    def _show(self, st: TaskState, text: str) -> None:
        st.last = text
        self.display.refresh()
