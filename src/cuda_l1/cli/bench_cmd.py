"""`cuda-l1 bench`, `cuda-l1 audit`, `cuda-l1 report`: baselines, published-kernel audits, reports."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from cuda_l1.cli.app import app, console, print_json
from cuda_l1.cli.eval_cmd import eval_config
from cuda_l1.errors import UserError
from cuda_l1.tasks import parse_levels

DEFAULT_STRATEGIES = "eager,compile,compile-max,compile-ro,cudagraph"


def _strategies(text: str) -> list[str]:
    from cuda_l1.strategies import STRATEGIES

    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown or not names:
        raise UserError(f"unknown strategy {', '.join(unknown) or '(none)'}; choose from {', '.join(STRATEGIES)}.")
    return names


def print_summary(summary: dict) -> None:
    table = Table(title="speedup of the best candidate per task")
    for col in ("scope", "tasks", "correct", "mean", "median", "geomean", "fast_1.0", "fast_1.5", "fast_2.0"):
        table.add_column(col)
    groups = [("all", summary["overall"])] + [(f"level {k}", v) for k, v in sorted(summary.get("levels", {}).items())]
    for name, g in groups:
        s, fp = g["speedup"], g["fast_p"]
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        table.add_row(name, str(g["n_tasks"]), str(g["n_correct"]), fmt(s.get("mean")), fmt(s.get("median")),
                      fmt(s.get("geomean")), fmt(fp.get("1")), fmt(fp.get("1.5")), fmt(fp.get("2")))
    console.print(table)


@app.command("bench")
def bench_command(
    source: str = typer.Argument("builtin", help="Tasks ('builtin', a KernelBench directory, a file) or "
                                 "candidates (a .jsonl solution set, or a directory with --tasks)."),
    strategies: str = typer.Option(DEFAULT_STRATEGIES, "--strategies", help="Offline strategies to evaluate."),
    levels: str = typer.Option(None, "--levels", help="Only these levels, e.g. 1,2."),
    device: str = typer.Option(None, "--device", help="cpu, cuda (all visible GPUs) or cuda:N; default: cuda if present."),
    out: Path = typer.Option(Path("runs/bench"), "--out", help="Run directory (store, report); reruns resume."),
    tasks: str = typer.Option(None, "--tasks", help="Task source for a directory of candidate files."),
    cluster: str = typer.Option("local", "--cluster", help="local, ray or ray://ADDRESS."),
    workers: int = typer.Option(None, "--workers", help="Workers (default: one per GPU; 1 on CPU)."),
    tolerance: str = typer.Option("oracle", "--tolerance", help="oracle (float64 reference) or kernelbench."),
    quick: bool = typer.Option(False, "--quick", help="Shorter timing (smoke runs; less precise)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Evaluate offline strategies (eager, torch.compile variants, CUDA graphs) or given candidates; write
    summary.json, results.csv, report.html and plots to --out."""
    from cuda_l1.bench import load_summary, run_bench

    result = run_bench(source, str(out), strategies=_strategies(strategies), levels=parse_levels(levels),
                       device=device, config=eval_config(device, tolerance, quick), cluster=cluster,
                       workers=workers, tasks_source=tasks, progress=not as_json)
    summary = load_summary(out)
    if as_json:
        print_json({**result, "summary": {"overall": summary["overall"], "levels": summary.get("levels", {})}})
        return
    for note in result["notes"]:
        console.print(f"[yellow]{note}[/]")
    c = result["counts"]
    console.print(f"{c['evaluated']} evaluated, {c['skipped']} already done (resumed)")
    print_summary(summary)
    console.print(f"report: {result['paths']['report']}")


@app.command("audit")
def audit_command(
    solutions: str = typer.Argument(..., help="A published solution set (.jsonl: level_id, task_id, ref_code, custom_code, score_*)."),
    device: str = typer.Option(None, "--device", help="cpu, cuda or cuda:N; default: cuda if present."),
    out: Path = typer.Option(Path("runs/audit"), "--out", help="Run directory; reruns resume."),
    cluster: str = typer.Option("local", "--cluster", help="local, ray or ray://ADDRESS."),
    workers: int = typer.Option(None, "--workers", help="Workers (default: one per GPU; 1 on CPU)."),
    hold: float = typer.Option(0.9, "--hold", help="A claim holds when measured >= HOLD x claimed."),
    tolerance: str = typer.Option("oracle", "--tolerance", help="oracle (float64 reference) or kernelbench."),
    quick: bool = typer.Option(False, "--quick", help="Shorter timing (smoke runs; less precise)."),
    as_json: bool = typer.Option(False, "--json", help="Print the audit as JSON."),
) -> None:
    """Re-evaluate a published solution set with this evaluator: claimed vs measured, per task and in total."""
    from cuda_l1.audit import run_audit

    if not solutions.endswith(".jsonl"):
        raise UserError("audit reads a .jsonl solution set.", path=solutions)
    result = run_audit(solutions, str(out), device=device, config=eval_config(device, tolerance, quick),
                       cluster=cluster, workers=workers, hold_fraction=hold, progress=not as_json)
    if as_json:
        print_json(result)
        return
    totals = result["totals"]
    console.print("claims: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    console.print(f"audit: {result['paths']['audit']}  report: {result['paths']['report']}")


@app.command("report")
def report_command(
    run_dirs: list[Path] = typer.Argument(..., help="One run directory, or two to compare side by side."),
    out: Path = typer.Option(None, "--out", help="Where a comparison is written (default: the first directory)."),
    labels: str = typer.Option(None, "--labels", help="Names of the two runs, e.g. H100,H200."),
) -> None:
    """Rebuild a run's report from its store; with two runs, compare them per task."""
    from cuda_l1.bench import STORE_NAME, write_run_report
    from cuda_l1.report import compare_runs, write_comparison
    from cuda_l1.store import Store

    for d in run_dirs:
        if not (d / STORE_NAME).is_file():
            raise UserError(f"not a run directory (no {STORE_NAME}).", path=str(d))
    if len(run_dirs) > 2:
        raise UserError("report takes one run directory, or two to compare.")
    rows = []
    for d in run_dirs:
        with Store(d / STORE_NAME) as store:
            runs = store.runs()
            if not runs:
                raise UserError("the store holds no run.", path=str(d))
            rows.append([r for run in runs for r in store.run_results(run.id)])
    if len(run_dirs) == 1:
        paths = write_run_report(run_dirs[0], rows[0], f"cuda-l1 report: {run_dirs[0]}")
        console.print(f"report: {paths['report']}")
        return
    names = tuple(labels.split(",")) if labels else (run_dirs[0].name, run_dirs[1].name)
    if len(names) != 2:
        raise UserError("--labels takes two names separated by a comma.")
    comparison = compare_runs(rows[0], rows[1], labels=names)
    target = out or run_dirs[0]
    target.mkdir(parents=True, exist_ok=True)
    written = write_comparison(target, comparison, title=f"{names[0]} vs {names[1]}")
    console.print(f"comparison: {written}")
