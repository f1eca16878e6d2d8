"""`cuda-l1 optimize`: the contrastive optimisation loop against an OpenAI-compatible endpoint."""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from cuda_l1.cli import options
from cuda_l1.cli.app import app, console, err_console, print_json
from cuda_l1.cli.bench_cmd import print_summary
from cuda_l1.cli.eval_cmd import eval_config
from cuda_l1.errors import RunError, UserError
from cuda_l1.tasks import parse_levels


# The strategies every task starts from. On a CPU only eager: compiling each task with torch.compile
# there takes longer than everything else in the README's main job together (measured on 2 cores).
GPU_STRATEGIES = "eager,compile,compile-ro,cudagraph"
CPU_STRATEGIES = "eager"


def endpoints_from_options(base_url: str | None, model: str | None, endpoints_file: Path | None,
                           api_key_env: str, max_tokens: int | None, temperature: float | None) -> list:
    """The endpoints the flags describe: none, the one of --base-url/--model, or those of --endpoints."""
    from cuda_l1.llm import endpoint_from_flags, load_endpoints

    if endpoints_file is not None:
        if base_url or model:
            raise UserError("give either --endpoints FILE or --base-url/--model, not both.")
        return load_endpoints(endpoints_file)
    if base_url is None and model is None:
        return []
    if not base_url or not model:
        raise UserError("--base-url and --model go together (the server's URL including /v1, and the model name).")
    settings = {}
    if max_tokens is not None:
        settings["max_tokens"] = max_tokens
    if temperature is not None:
        settings["temperature"] = temperature
    return [endpoint_from_flags(base_url, model, api_key_env, **settings)]


def _strategy_names(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def print_tasks(result: dict) -> None:
    table = Table(title="best verified candidate per task (this run)", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("task", "done", "no code", "best", "from"):  # short headers: 80 columns hold the longest task
        table.add_column(column, no_wrap=column != "from", overflow="fold")
    for t in result["tasks"]:
        best = "-" if t["best_speedup"] is None else f"{t['best_speedup']:.2f}x"
        table.add_row(escape(t["task"]), f"{t['completions']}/{t['budget']}", str(t["parse_errors"]), best,
                      escape(t["best_origin"] or "-"))
    console.print(table)


@app.command("optimize")
def optimize_command(
    source: str = typer.Argument("builtin", metavar="SOURCE", help="Tasks: 'builtin', a KernelBench directory, "
                                 "a task .py file or a .jsonl solution set."),
    base_url: str = typer.Option(None, "--base-url", metavar="URL",
                                 help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1."),
    model: str = typer.Option(None, "--model", metavar="NAME", help="Model name sent to --base-url."),
    endpoints: Path = typer.Option(None, "--endpoints", metavar="FILE", help="TOML/JSON file listing several endpoints."),
    api_key_env: str = typer.Option("OPENAI_API_KEY", "--api-key-env", metavar="VAR",
                                    help="Environment variable holding the key for --base-url (its name, not the key)."),
    budget: int = typer.Option(8, "--budget", metavar="N", min=0, help="LLM completions per task in this run."),
    device: str = options.device(),
    out: Path = typer.Option(Path("runs/optimize"), "--out", metavar="DIR",
                             help="Run directory; rerunning the same command resumes."),
    levels: str = options.levels(),
    task_ids: str = typer.Option(None, "--tasks", metavar="ID[,ID...]",
                                 help="Only these tasks: ids or names as `cuda-l1 tasks list` shows them."),
    concurrency: int = typer.Option(8, "--concurrency", metavar="N", min=1,
                                    help="Attempts (LLM request + evaluation) in flight across tasks."),
    per_task: int = typer.Option(1, "--per-task", metavar="N", min=1, help="Attempts in flight per task (1: each "
                                 "prompt sees every earlier result of its task)."),
    strategies: str = typer.Option(None, "--strategies", metavar="NAMES",
                                   help=f"Offline strategies every task starts from (those that do not apply on the "
                                   f"device are skipped). Default: {GPU_STRATEGIES} on a GPU, {CPU_STRATEGIES} on a "
                                   "CPU, where torch.compile spends 10-40 s compiling each task on 2 cores."),
    max_tokens: int = typer.Option(None, "--max-tokens", metavar="N",
                                   help="Completion token limit for --base-url (default 4096)."),
    temperature: float = typer.Option(None, "--temperature", metavar="T",
                                      help="Sampling temperature for --base-url (default 1.0)."),
    cluster: str = options.cluster(),
    workers: int = options.workers(),
    tolerance: str = options.tolerance(),
    module_mode: str = options.module_mode(),
    quick: bool = options.batch_timing(),
    timeout: float = options.timeout(),
    calibrate: bool = options.calibrate(),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed of the exemplar draws."),
    as_json: bool = options.as_json("the result"),
) -> None:
    """Optimize tasks with an LLM: each prompt shows earlier variants with their measured speedups.

    Recent failures are shown too; every answer is evaluated and written back. Writes solutions.jsonl
    (the format `cuda-l1 audit` reads), summary.json, results.csv, report.html and events.jsonl to --out.
    Without an endpoint only the offline strategies run."""
    from cuda_l1.bench import load_summary, select_tasks
    from cuda_l1.reference_runs import check_references
    from cuda_l1.devices import parse_device
    from cuda_l1.tasks import for_device
    from cuda_l1.cli.calibrate_cmd import eager_is_the_noise_check, noise_check
    from cuda_l1.search import SearchConfig, run_optimize
    from cuda_l1.search.run import pick_tasks

    chosen = endpoints_from_options(base_url, model, endpoints, api_key_env, max_tokens, temperature)
    level_set = parse_levels(levels)
    target = parse_device(device, cluster)
    evaluation = eval_config(target, tolerance, quick, timeout=timeout, module_mode=module_mode)
    if strategies is None:
        strategies = GPU_STRATEGIES if target.is_cuda else CPU_STRATEGIES
    config = SearchConfig(budget=budget, concurrency=concurrency, per_task=per_task,
                          strategies=_strategy_names(strategies), seed=seed)
    selectors = [t.strip() for t in (task_ids or "").split(",") if t.strip()]
    tasks = pick_tasks(select_tasks(for_device(source, target), level_set), selectors)
    check_references(tasks, target, mode=evaluation.module_mode, timeout_s=evaluation.task_timeout_s)
    if calibrate is None:  # not asked either way: a run of eager is its own check
        calibrate = not eager_is_the_noise_check(config.strategies)
    if calibrate:
        noise_check(tasks, evaluation, target, out, quiet=as_json)
    result = run_optimize(source, out, endpoints=chosen, config=config, eval_config=evaluation,
                          device=target, levels=level_set, cluster=cluster, workers=workers,
                          progress=True, tasks=selectors)  # progress goes to stderr: --json output stays clean
    if as_json:
        print_json({**result, "noise": load_summary(out).get("noise")})
    else:
        for note in result["notes"]:
            if note != result["hint"]:
                console.print(f"[yellow]{escape(note)}[/]", highlight=False)
        print_tasks(result)
        print_summary(load_summary(out))
        c, llm = result["counts"], result["llm"]
        line = (f"{c['completions']} completions ({c['parse_errors']} without usable code), "
                f"{c['evaluated']} evaluated now, {c['reused']} duplicate(s) not re-evaluated")
        if llm:
            line += (f"; {llm['prompt_tokens']} prompt + {llm['completion_tokens']} completion tokens"
                     + (f", cost {llm['cost']:.4f}" if llm["cost"] else ""))
        console.print(line, markup=False)
        console.print(f"solutions: {result['paths']['solutions']}  report: {result['paths']['report']}", markup=False)
    if result["hint"]:
        err_console.print(f"[yellow]{escape(result['hint'])}[/]", highlight=False)
    if result["stopped"]:
        raise RunError(f"stopped early: {result['stopped']}")
