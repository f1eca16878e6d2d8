"""`cuda-l1 optimize`: the contrastive optimisation loop against an OpenAI-compatible endpoint."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from cuda_l1.cli.app import app, console, err_console, print_json
from cuda_l1.cli.bench_cmd import print_summary
from cuda_l1.cli.eval_cmd import eval_config
from cuda_l1.errors import UserError
from cuda_l1.tasks import parse_levels


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
    table = Table(title="best verified candidate per task (this run)")
    for column in ("task", "completions", "parse errors", "best", "from"):
        table.add_column(column)
    for t in result["tasks"]:
        best = "-" if t["best_speedup"] is None else f"{t['best_speedup']:.2f}x"
        table.add_row(t["task"], f"{t['completions']}/{t['budget']}", str(t["parse_errors"]), best,
                      t["best_origin"] or "-")
    console.print(table)


@app.command("optimize")
def optimize_command(
    source: str = typer.Argument("builtin", help="Tasks: 'builtin', a KernelBench directory, a task .py file "
                                 "or a .jsonl solution set."),
    base_url: str = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1."),
    model: str = typer.Option(None, "--model", help="Model name sent to --base-url."),
    endpoints: Path = typer.Option(None, "--endpoints", help="TOML/JSON file listing several endpoints."),
    api_key_env: str = typer.Option("OPENAI_API_KEY", "--api-key-env",
                                    help="Environment variable holding the key for --base-url (its name, not the key)."),
    budget: int = typer.Option(8, "--budget", help="LLM completions per task in this run."),
    device: str = typer.Option(None, "--device", help="cpu, cuda (all visible GPUs) or cuda:N; default: cuda if present."),
    out: Path = typer.Option(Path("runs/optimize"), "--out", help="Run directory; rerunning the same command resumes."),
    levels: str = typer.Option(None, "--levels", help="Only these levels, e.g. 1,2."),
    concurrency: int = typer.Option(8, "--concurrency", help="Attempts (LLM request + evaluation) in flight across tasks."),
    per_task: int = typer.Option(1, "--per-task", help="Attempts in flight per task (1: each prompt sees every "
                                 "earlier result of its task)."),
    strategies: str = typer.Option("eager,compile,compile-ro,cudagraph", "--strategies",
                                   help="Offline strategies every task starts from (those that do not apply on the "
                                   "device are skipped)."),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Completion token limit for --base-url (default 4096)."),
    temperature: float = typer.Option(None, "--temperature", help="Sampling temperature for --base-url (default 1.0)."),
    cluster: str = typer.Option("local", "--cluster", help="local, ray or ray://ADDRESS."),
    workers: int = typer.Option(None, "--workers", help="Evaluation workers (default: one per GPU; 1 on CPU)."),
    tolerance: str = typer.Option("oracle", "--tolerance", help="oracle (float64 reference) or kernelbench."),
    quick: bool = typer.Option(False, "--quick", help="Shorter timing (smoke runs; less precise)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the exemplar draws."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Optimize tasks with an LLM: each prompt shows earlier variants with their measured speedups and
    recent failures; every answer is evaluated and written back. Writes solutions.jsonl (the format
    `cuda-l1 audit` reads), summary.json, results.csv, report.html and events.jsonl to --out."""
    from cuda_l1.search import SearchConfig, run_optimize

    chosen = endpoints_from_options(base_url, model, endpoints, api_key_env, max_tokens, temperature)
    config = SearchConfig(budget=budget, concurrency=concurrency, per_task=per_task,
                          strategies=_strategy_names(strategies), seed=seed)
    result = run_optimize(source, out, endpoints=chosen, config=config,
                          eval_config=eval_config(device, tolerance, quick), device=device,
                          levels=parse_levels(levels), cluster=cluster, workers=workers, progress=not as_json)
    if as_json:
        print_json(result)
    else:
        for note in result["notes"]:
            if note != result["hint"]:
                console.print(f"[yellow]{note}[/]", highlight=False)
        print_tasks(result)
        from cuda_l1.bench import load_summary

        print_summary(load_summary(out))
        c, llm = result["counts"], result["llm"]
        line = (f"{c['completions']} completions ({c['parse_errors']} without usable code), "
                f"{c['evaluated']} evaluated now, {c['reused']} duplicate(s) not re-evaluated")
        if llm:
            line += (f"; {llm['prompt_tokens']} prompt + {llm['completion_tokens']} completion tokens"
                     + (f", cost {llm['cost']:.4f}" if llm["cost"] else ""))
        console.print(line)
        console.print(f"solutions: {result['paths']['solutions']}  report: {result['paths']['report']}")
    if result["hint"]:
        err_console.print(f"[yellow]{result['hint']}[/]", highlight=False)
    if result["stopped"]:
        err_console.print(f"[bold red]stopped early:[/] {result['stopped']}", highlight=False)
        raise typer.Exit(1)
