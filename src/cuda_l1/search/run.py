"""`cuda-l1 optimize` as a function: strategies first, then the LLM loop, then solutions and the report.

A run directory holds `history.sqlite` (the store), `events.jsonl`, `solutions.jsonl`, `summary.json`,
`results.csv`, `report.html` and the plots. Rerunning the same call on the same directory continues
the run: nothing judged is judged again and no task gets more completions than its budget.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path
from typing import Sequence

from cuda_l1.bench import (
    RunContext,
    evaluate_candidates,
    strategy_candidates,
    tasks_not_run_error,
    write_run_report,
)
from cuda_l1.devices import Device, as_device, device_key
from cuda_l1.engine import Engine
from cuda_l1.errors import UserError
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.pool import make_pool
from cuda_l1.evaluate.verdict import PARSE_ERROR
from cuda_l1.llm import EndpointConfig, make_client, sum_stats
from cuda_l1.search.search_config import EVENTS_NAME, RUN_NAME, SOLUTIONS_NAME, SearchConfig
from cuda_l1.search.display import Display
from cuda_l1.search.ledger import EventLog, parse_error_rows, spent_per_task
from cuda_l1.search.loop import Search, TaskState
from cuda_l1.search.secrets import hidden_credentials
from cuda_l1.store.export import export_solutions_jsonl
from cuda_l1.store.records import origin_label
from cuda_l1.tasks import Task, find_task, for_device, load_tasks

NO_ENDPOINT_HINT = (
    "No LLM endpoint configured: only the offline strategies ran. To let a model optimize the tasks, add "
    "--base-url URL --model NAME (any OpenAI-compatible server: vLLM, SGLang, DeepSeek, OpenAI; the key is "
    "read from --api-key-env, default OPENAI_API_KEY) or --endpoints FILE (several endpoints); "
    "see docs/optimize.md."
)


def pick_tasks(tasks: list[Task], selectors: Sequence[str] | None) -> list[Task]:
    """The tasks `selectors` name (ids, id prefixes, names, L1/NAME keys or level/number, as `cuda-l1
    tasks list` shows them), each once, in the order named; all of `tasks` when no selector is given."""
    if not selectors:
        return tasks
    picked: dict[str, Task] = {}
    for selector in selectors:
        task = find_task(tasks, selector)
        picked.setdefault(task.id, task)
    return list(picked.values())


def _resumable(pending: list, task_ids: set[str]) -> tuple[list, int]:
    """Of the candidates a killed run left unjudged, those to judge now: the model's answers for the
    selected tasks. An offline strategy's candidate is judged only while its strategy is in the
    current --strategies, which `evaluate_candidates` has just done; the others are left unjudged
    (a rerun that drops a slow strategy must not wait for it). Returns (to judge, left out)."""
    keep = [r for r in pending if r.task_id in task_ids and r.origin.get("kind") != "strategy"]
    return keep, sum(r.task_id in task_ids for r in pending) - len(keep)


def _states(ctx: RunContext, tasks: list[Task], config: SearchConfig, spent: dict[str, int],
            parse_errors: dict[str, int], device: str, config_key: str) -> list[TaskState]:
    states = []
    for task in tasks:
        best = ctx.store.best_candidate(task.id, device, config_key=config_key)
        states.append(TaskState(
            task=task, budget=config.budget, spent=spent.get(task.id, 0), parse_errors=parse_errors.get(task.id, 0),
            best=best.speedup if best else None, best_origin=origin_label(best.origin) if best else "",
            rng=random.Random(f"{config.seed}:{task.id}:{spent.get(task.id, 0)}"),
        ))
    return states


def _task_summaries(ctx: RunContext, tasks: list[Task], config: SearchConfig, completions: list[dict],
                    states: list[TaskState], device: str) -> list[dict]:
    spent = spent_per_task(completions)
    by_task = {st.task.id: st for st in states}
    out = []
    for task in tasks:
        mine = [c for c in completions if c["task_id"] == task.id]
        best = ctx.store.best_candidate(task.id, device, run_id=ctx.run_id)
        st = by_task.get(task.id)
        out.append({
            "task": task.key,
            "task_id": task.id,
            "budget": config.budget,
            "completions": spent.get(task.id, 0),
            "parse_errors": sum(c["parse_status"] == PARSE_ERROR for c in mine),
            "evaluated_now": st.evaluated if st else 0,
            "reused_now": st.reused if st else 0,
            "best_speedup": best.speedup if best else None,
            "best_origin": origin_label(best.origin) if best else None,
            "best_candidate_id": best.candidate_id if best else None,
        })
    return out


def run_optimize(source: str, out_dir: str | Path, *, endpoints: Sequence[EndpointConfig] = (),
                 config: SearchConfig | None = None, eval_config: EvalConfig | None = None,
                 device: Device | str | None = None, levels: set[int] | None = None, cluster: str = "local",
                 workers: int | None = None, progress: bool = True, tasks: Sequence[str] | None = None) -> dict:
    """Optimize the tasks of `source` (those of `levels`, and only those `tasks` names when given);
    returns what happened (per task, counts, LLM usage, paths)."""
    config = config or SearchConfig()
    device = as_device(device, cluster)
    eval_config = dataclasses.replace(eval_config or EvalConfig(), device=str(device))
    source = for_device(source, device)
    selected = load_tasks(source, levels=levels)
    if not selected:
        raise UserError("no tasks to optimize (check --levels).", path=source)
    tasks = pick_tasks(selected, tasks)
    dkey, ckey = device_key(device), eval_config.config_key()
    ctx = RunContext(out_dir, RUN_NAME, {"source": source, "device": str(device), "budget": config.budget,
                                         "endpoints": [e.label for e in endpoints]})
    events = EventLog(ctx.out_dir / EVENTS_NAME)
    notes: list[str] = []
    # The client reads its keys now; from here on they are out of the environment that workers inherit.
    client = make_client(list(endpoints)) if endpoints else None
    closed = client is None
    search = None
    states: list[TaskState] = []
    try:
        with hidden_credentials(e.api_key_env for e in endpoints):
            for task in tasks:
                ctx.store.add_task(task)
            before = ctx.store.run_completions(ctx.run_id)
            spent = spent_per_task(before)
            events.write("start", run_id=ctx.run_id, resumed=ctx.resumed, device=dkey, budget=config.budget,
                         tasks=[t.key for t in tasks], endpoints=[e.label for e in endpoints],
                         spent={t.key: spent.get(t.id, 0) for t in tasks})
            candidates, skipped = strategy_candidates(tasks, list(config.strategies), str(device))
            notes.extend(skipped)
            baseline_counts = evaluate_candidates(
                ctx, candidates, eval_config, device=device, cluster=cluster, workers=workers, progress=progress,
                on_result=lambda cand, v: events.write("verdict", task=cand.task.key, candidate_id=v.candidate_id,
                                                       origin=cand.label, status=v.status, speedup=v.speedup,
                                                       new=True))
            if baseline_counts["broken_tasks"]:  # a search of a task whose reference does not run: bad input
                raise tasks_not_run_error(baseline_counts["broken_tasks"], ctx.out_dir, before_search=True)
            parse_errors = {}
            for c in before:
                if c["parse_status"] == PARSE_ERROR:
                    parse_errors[c["task_id"]] = parse_errors.get(c["task_id"], 0) + 1
            states = _states(ctx, tasks, config, spent, parse_errors, dkey, ckey)
            pending, left_out = _resumable(ctx.store.unevaluated_candidates(ctx.run_id, dkey, ckey),
                                           {t.id for t in tasks})
            if left_out:
                notes.append(f"{left_out} candidate(s) of strategies not in --strategies, left unjudged by an "
                             "earlier session, were not judged")
            if pending or client is not None:
                with make_pool(cluster, str(device), eval_config, workers) as pool, \
                        Display(states, enabled=progress and client is not None,
                                title=f"optimizing on {dkey}") as display:
                    engine = Engine(ctx.store, pool, device_key=dkey, config_key=ckey, run_id=ctx.run_id)
                    search = Search(store=ctx.store, run_id=ctx.run_id, states=states, client=client, engine=engine,
                                    device=dkey, config_key=ckey, config=config, events=events, display=display)

                    async def drive() -> None:
                        nonlocal closed
                        try:
                            await search.run(pending)
                        finally:
                            if client is not None:
                                await client.aclose()
                                closed = True

                    asyncio.run(drive())
        if client is None:
            notes.append(NO_ENDPOINT_HINT)
        completions = ctx.store.run_completions(ctx.run_id)
        solutions = ctx.out_dir / SOLUTIONS_NAME
        n_solutions = export_solutions_jsonl(ctx.store, solutions, run_id=ctx.run_id, device=dkey)
        # A completion without usable code has no candidate (so no verdict row), yet it is a failed
        # attempt the report must count: it is added as a parse_error row.
        extra = parse_error_rows(completions, {t.id: t for t in tasks}, dkey)
        rows = ctx.store.run_results(ctx.run_id) + extra
        paths = write_run_report(ctx.out_dir, rows, f"cuda-l1 optimize: {source} on {dkey}", notes)
        paths = {k: str(v) for k, v in paths.items()}
        paths.update(solutions=str(solutions), events=str(events.path), store=str(ctx.store.path))
        result = {
            "run_id": ctx.run_id,
            "resumed": ctx.resumed,
            "device": dkey,
            "endpoints": [e.label for e in endpoints],
            "tasks": _task_summaries(ctx, tasks, config, completions, states, dkey),
            "counts": {
                "strategies": baseline_counts,
                "completions": len(completions),
                "parse_errors": sum(c["parse_status"] == PARSE_ERROR for c in completions),
                "evaluated": search.evaluations if search else 0,
                "reused": search.reused if search else 0,
                "resumed_evaluations": len(pending),
                "solutions": n_solutions,
            },
            "llm": sum_stats(client.stats()) if client is not None else None,
            "stopped": search.stopped if search else None,
            "hint": None if client is not None else NO_ENDPOINT_HINT,
            "notes": notes,
            "paths": paths,
        }
        events.write("done", completions=len(completions), stopped=result["stopped"])
        return result
    finally:
        if not closed:
            asyncio.run(client.aclose())
        events.close()
        ctx.close()
