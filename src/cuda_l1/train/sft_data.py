"""Stage 1, data: sample kernels from LLM endpoints for every task and keep the verified ones.

For each (task, endpoint) pair: up to `attempts_per_task` completions of the zero-exemplar contrastive
prompt, in requests of `batch_size`, until `successes_per_task` of them pass the evaluator. Every
prompt, completion, candidate and verdict goes to the history store; the attempt counts of the run
are kept in the run's notes, so a rerun with the same output folder resumes where it stopped (the
dataset rows already written stay, and exhausted pairs are not sampled again).

Outputs in OUTPUT_DIR/data: sft.jsonl (one row per verified candidate), dataset/ (the same rows
written by datasets' save_to_disk) and stats.json.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cuda_l1.contrastive import build_prompt
from cuda_l1.llm import EndpointConfig, LLMClient, load_endpoints
from cuda_l1.store import Store
from cuda_l1.tasks import Task
from cuda_l1.train.dataset import append_jsonl, dedupe, make_row, read_jsonl, save_dataset
from cuda_l1.train.attempts import Attempt, Judge, Outcome, rates
from cuda_l1.train.sft_config import SFTStageConfig

RUN_NAME = "train-sft-data"
MAX_FAILED_REQUESTS = 3  # consecutive failed requests after which a (task, endpoint) pair is given up for this session


def data_paths(output_dir: str | Path) -> dict[str, Path]:
    data = Path(output_dir) / "data"
    return {"dir": data, "jsonl": data / "sft.jsonl", "dataset": data / "dataset", "stats": data / "stats.json"}


@dataclass
class Pair:
    task: Task
    endpoint: EndpointConfig
    attempts: int = 0
    successes: int = 0
    failed_requests: int = 0

    @property
    def key(self) -> str:
        return f"{self.task.id}|{self.endpoint.label}"


def find_or_start_run(store: Store, output_dir: Path, config: dict) -> tuple[int, dict]:
    """The run this output folder already started (resume), else a new one; with its attempt ledger."""
    resolved = str(output_dir.resolve())
    for run in reversed(store.runs(RUN_NAME)):
        if run.config.get("output_dir") == resolved:
            try:
                ledger = json.loads(run.notes) if run.notes else {}
            except json.JSONDecodeError:
                ledger = {}
            return run.id, ledger
    return store.start_run(RUN_NAME, {**config, "output_dir": resolved}), {}


def _active(pair: Pair, attempts: int, successes: int) -> bool:
    if pair.failed_requests >= MAX_FAILED_REQUESTS or pair.attempts >= attempts:
        return False
    return successes == 0 or pair.successes < successes


async def _request(client: LLMClient, pair: Pair, messages: list[dict], n: int):
    return pair, await client.complete(messages, n)


async def _sample(config: SFTStageConfig, pairs: list[Pair], prompts: dict[str, list[dict]], judge: Judge,
                  ledger: dict, paths: dict[str, Path], progress: Progress, bar) -> list[Outcome]:
    data = config.data
    clients = {}
    for pair in pairs:
        if pair.endpoint.label not in clients:
            clients[pair.endpoint.label] = LLMClient(pair.endpoint, seed=config.seed)
    store = judge.store
    session: list[Outcome] = []
    try:
        while True:
            active = [p for p in pairs if _active(p, data.attempts_per_task, data.successes_per_task)]
            if not active:
                return session
            for start in range(0, len(active), data.concurrency):
                chunk = active[start:start + data.concurrency]
                replies = await asyncio.gather(*(
                    _request(clients[p.endpoint.label], p, prompts[p.task.id],
                             min(data.batch_size, data.attempts_per_task - p.attempts)) for p in chunk))
                attempts: list[Attempt] = []
                owners: list[Pair] = []
                for pair, completions in replies:
                    answered = [c for c in completions if c.ok]
                    if not answered:
                        pair.failed_requests += 1
                        continue
                    pair.failed_requests = 0
                    prompt_id = store.record_prompt(pair.task.id, prompts[pair.task.id], run_id=judge.run_id)
                    for c in answered:
                        attempts.append(Attempt(pair.task, c.text, prompt_id, model=c.model, endpoint=c.endpoint,
                                                finish_reason=c.finish_reason, prompt_tokens=c.prompt_tokens,
                                                completion_tokens=c.completion_tokens, latency_s=c.latency_s))
                        owners.append(pair)
                outcomes = await asyncio.to_thread(judge.judge, attempts, lambda k: progress.advance(bar, k))
                rows = []
                for pair, outcome in zip(owners, outcomes):
                    pair.attempts += 1
                    if outcome.ok:
                        pair.successes += 1
                        rows.append(make_row(prompts[pair.task.id], outcome, data.completion_format,
                                             endpoint=pair.endpoint.label))
                append_jsonl(paths["jsonl"], rows)
                ledger["attempts"] = {p.key: p.attempts for p in pairs}
                ledger["successes"] = {p.key: p.successes for p in pairs}
                store.set_run_notes(judge.run_id, json.dumps(ledger, sort_keys=True))
                session.extend(outcomes)
    finally:
        for client in clients.values():
            await client.aclose()


def sample_sft_data(config: SFTStageConfig, tasks: list[Task], store: Store, judge_factory,
                    console: Console | None = None) -> dict:
    """Run (or resume) the data phase; returns the summary also written to data/stats.json.

    judge_factory(run_id) -> Judge: the caller owns the evaluation pool.
    """
    output_dir = Path(config.output_dir)
    paths = data_paths(output_dir)
    paths["dir"].mkdir(parents=True, exist_ok=True)
    endpoints = load_endpoints(config.data.endpoints)
    run_id, ledger = find_or_start_run(store, output_dir, {"stage": "sft-data", "data": vars(config.data),
                                                           "tasks": [t.id for t in tasks]})
    judge: Judge = judge_factory(run_id)
    prompts = {t.id: build_prompt(t.source, [], [], config.data.gpu_name, task_name=t.name) for t in tasks}
    pairs = [Pair(t, e) for t in tasks for e in endpoints]
    for pair in pairs:
        pair.attempts = int(ledger.get("attempts", {}).get(pair.key, 0))
        pair.successes = int(ledger.get("successes", {}).get(pair.key, 0))
    data = config.data
    remaining = sum(max(0, data.attempts_per_task - p.attempts) for p in pairs
                    if _active(p, data.attempts_per_task, data.successes_per_task))
    with Progress(TextColumn("[bold]sampling + evaluating"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[note]}"), TimeElapsedColumn(),
                  console=console or Console(stderr=True), transient=False) as progress:
        bar = progress.add_task("sft-data", total=remaining or None, note="(at most; stops at the first successes)")
        session = asyncio.run(_sample(config, pairs, prompts, judge, ledger, paths, progress, bar))
    rows = dedupe(read_jsonl(paths["jsonl"]))
    if paths["dataset"].exists():
        shutil.rmtree(paths["dataset"])
    if rows:
        save_dataset(rows, paths["dataset"])
    summary = {
        "run_id": run_id,
        "tasks": len(tasks),
        "endpoints": [e.label for e in endpoints],
        "attempts": sum(p.attempts for p in pairs),
        "successes": sum(p.successes for p in pairs),
        "tasks_solved": len({r["task_id"] for r in rows}),
        "rows": len(rows),
        "evaluations": judge.evaluations,
        "gave_up": [p.key for p in pairs if p.failed_requests >= MAX_FAILED_REQUESTS],
        "session": rates(session),
    }
    paths["stats"].write_text(json.dumps(summary, indent=2))
    return summary
