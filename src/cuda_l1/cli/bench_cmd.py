"""`cuda-l1 bench`, `cuda-l1 audit`, `cuda-l1 report`: baselines, published-kernel audits, reports."""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from cuda_l1.cli import options
from cuda_l1.cli.app import app, console, err_console, print_json
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


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_summary(summary: dict) -> None:
    """The headline table; narrow enough for 80 columns (no vertical rules, short headers)."""
    table = Table(title="speedup of the best candidate per task", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("scope", "tasks", "correct", "mean", "median", "geomean", "fast_1", "fast_1.5", "fast_2"):
        table.add_column(col, no_wrap=True, justify="left" if col == "scope" else "right")
    groups = [("all", summary["overall"])] + [(f"L{k}", v) for k, v in sorted(summary.get("levels", {}).items())]
    for name, g in groups:
        s, fp = g["speedup"], g["fast_p"]
        table.add_row(name, str(g["n_tasks"]), str(g["n_correct"]), _fmt(s.get("mean")), _fmt(s.get("median")),
                      _fmt(s.get("geomean")), _fmt(fp.get("1")), _fmt(fp.get("1.5")), _fmt(fp.get("2")))
    console.print(table)
    noise = summary.get("noise") or {}
    colour = "bold red" if noise.get("too_noisy") else "green"
    for text in noise.get("verdicts", []):
        err_console.print(f"[{colour}]{escape(text)}[/]", highlight=False, soft_wrap=True)
    if noise.get("too_noisy"):
        err_console.print("[bold red]these results are marked as measured on a host too noisy to trust.[/]")


@app.command("bench")
def bench_command(
    source: str = typer.Argument("builtin", metavar="SOURCE",
                                 help="Tasks ('builtin', a KernelBench directory, a file) or candidates (a .jsonl "
                                 "solution set, or a directory with --tasks)."),
    strategies: str = typer.Option(DEFAULT_STRATEGIES, "--strategies", metavar="NAMES",
                                   help="Offline strategies to evaluate, comma-separated."),
    levels: str = options.levels(),
    limit: int = typer.Option(None, "--limit", metavar="N", min=1, help="Only the first N tasks (after --levels)."),
    device: str = options.device(),
    out: Path = typer.Option(Path("runs/bench"), "--out", metavar="DIR",
                             help="Run directory (store, report); reruns resume."),
    tasks: str = typer.Option(None, "--tasks", metavar="SOURCE", help="Task source for a directory of candidate files."),
    cluster: str = options.cluster(),
    workers: int = options.workers(),
    tolerance: str = options.tolerance(),
    module_mode: str = options.module_mode(),
    quick: bool = options.batch_timing(),
    timeout: float = options.timeout(),
    calibrate: bool = options.calibrate(),
    rejudge: str = options.rejudge(),
    verdicts_from: Path = options.verdicts_from(),
    as_json: bool = options.as_json("the summary"),
) -> None:
    """Evaluate offline strategies (eager, torch.compile variants, CUDA graphs) or given candidates.

    Writes summary.json, results.csv, report.html and plots to --out."""
    from cuda_l1.bench import (check_tasks_option, load_summary, read_imported, run_bench, select_tasks,
                               tasks_not_run_error)
    from cuda_l1.reference_runs import references_that_run
    from cuda_l1.calibrate import pick_tasks
    from cuda_l1.cli.calibrate_cmd import eager_is_the_noise_check, noise_check
    from cuda_l1.devices import parse_device
    from cuda_l1.tasks import for_device

    check_tasks_option(source, tasks)
    chosen = _strategies(strategies)
    level_set, statuses = parse_levels(levels), options.parse_statuses(rejudge)
    imported = read_imported(verdicts_from)
    target = parse_device(device, cluster)
    config = eval_config(target, tolerance, quick, timeout=timeout, module_mode=module_mode)
    strategies_run = not tasks and not str(source).endswith(".jsonl")  # else the candidates are given
    if calibrate is None:  # not asked either way: a run of eager is its own check
        calibrate = not (strategies_run and eager_is_the_noise_check(chosen))
    if calibrate:  # the tasks of the run: of --tasks for a folder of candidates, else of SOURCE
        noise_tasks = select_tasks(for_device(tasks or source, target), level_set, limit)
        # those it times, not all; a broken one is left to the run, which judges the other tasks first
        noise_tasks = references_that_run(pick_tasks(noise_tasks, len(noise_tasks)), target, 3,
                                          mode=config.module_mode, timeout_s=config.task_timeout_s)
        if noise_tasks:
            noise_check(noise_tasks, config, target, out, quiet=as_json, count=3)
    result = run_bench(source, str(out), strategies=chosen, levels=level_set, device=target, config=config,
                       cluster=cluster, workers=workers, tasks_source=tasks, progress=True, limit=limit,
                       rejudge=statuses, imported=imported)
    summary = load_summary(out)
    broken = result["counts"].get("broken_tasks")
    if as_json:
        print_json({**result, "summary": {"overall": summary["overall"], "levels": summary.get("levels", {}),
                                          "noise": summary.get("noise")}})
        if broken:
            raise tasks_not_run_error(broken, result["paths"]["report"])
        return
    for note in result["notes"]:
        console.print(f"[yellow]{escape(note)}[/]")
    c = result["counts"]
    console.print(f"{c['evaluated']} evaluated, {c['skipped']} already done (resumed), "
                  f"{c.get('reused', 0)} duplicate(s) of a judged program"
                  + (f", {c['rejudged']} judged again (--rejudge)" if c.get("rejudged") else "")
                  + (f", {c['imported']} taken from --verdicts-from" if c.get("imported") else "")
                  + (f", {len(broken)} task(s) not judged (below)" if broken else ""))
    print_summary(summary)
    console.print(f"report: {result['paths']['report']}", markup=False)
    if broken:  # after the report: the other tasks' results are printed and kept (exit 2)
        raise tasks_not_run_error(broken, result["paths"]["report"])


@app.command("audit")
def audit_command(
    solutions: str = typer.Argument(..., metavar="SOLUTIONS", help="A published solution set (.jsonl: level_id, "
                                    "task_id, ref_code, custom_code, score_*)."),
    device: str = options.device(),
    out: Path = typer.Option(Path("runs/audit"), "--out", metavar="DIR", help="Run directory; reruns resume."),
    cluster: str = options.cluster(),
    workers: int = options.workers(),
    hold: float = typer.Option(0.9, "--hold", metavar="FRACTION", help="A claim holds when measured >= FRACTION x claimed."),
    tolerance: str = options.tolerance(),
    module_mode: str = options.module_mode("eval"),
    levels: str = options.levels(),
    quick: bool = options.batch_timing(),
    timeout: float = options.timeout(),
    rejudge: str = options.rejudge(),
    verdicts_from: Path = options.verdicts_from(),
    as_json: bool = options.as_json("the audit"),
) -> None:
    """Re-evaluate a published solution set with this evaluator: claimed vs measured, per task and in total.

    The models run in eval mode by default, as CUDA-L1's harness runs them when its claims are measured
    (a kernel that folds BatchNorm into a convolution is right in eval mode only)."""
    from cuda_l1.audit import run_audit
    from cuda_l1.bench import read_imported, tasks_not_run_error
    from cuda_l1.devices import parse_device

    if not solutions.endswith(".jsonl"):
        raise UserError("audit reads a .jsonl solution set.", path=solutions)
    if not 0 < hold <= 1:  # nan fails this too; -1 made every claim hold
        raise UserError(f"--hold takes a fraction above 0 and at most 1 (got {hold}).")
    target, statuses = parse_device(device, cluster), options.parse_statuses(rejudge)
    imported = read_imported(verdicts_from)
    config = eval_config(target, tolerance, quick, timeout=timeout, module_mode=module_mode)
    result = run_audit(solutions, str(out), device=target, config=config, cluster=cluster, workers=workers,
                       hold_fraction=hold, progress=True, levels=parse_levels(levels), rejudge=statuses,
                       imported=imported)
    broken = result["broken_tasks"]
    if not as_json:
        totals = result["totals"]
        console.print("claims: " + ", ".join(f"{k} {v}" for k, v in totals.items()), markup=False)
        console.print(f"audit: {result['paths']['audit']}  report: {result['paths']['report']}", markup=False)
    else:
        print_json(result)
    if broken:  # counted in the table as task_broken; bad input all the same (exit 2), after the table
        raise tasks_not_run_error(broken, result["paths"]["audit"])


@app.command("report")
def report_command(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A run directory (made by bench, audit or optimize)."),
    other: Path = typer.Argument(None, metavar="OTHER_RUN_DIR", show_default=False,
                                 help="A second run directory, to compare the two per task."),
    out: Path = typer.Option(None, "--out", metavar="DIR", help="Where a comparison is written (default: RUN_DIR)."),
    labels: str = typer.Option(None, "--labels", metavar="A,B", help="Names of the two runs, e.g. H100,H200."),
) -> None:
    """Rebuild a run's report from its store; with two runs, compare them per task."""
    from cuda_l1.bench import STORE_NAME, write_run_report
    from cuda_l1.report import compare_runs, write_comparison
    from cuda_l1.store import Store
    from cuda_l1.store.verdict_file import VERDICTS_NAME, write_verdicts

    run_dirs = [run_dir] + ([other] if other is not None else [])
    for d in run_dirs:
        if not (d / STORE_NAME).is_file():
            raise UserError(f"not a run directory (no {STORE_NAME}).", path=str(d))
    rows, not_run = [], []
    for d in run_dirs:
        with Store(d / STORE_NAME) as store:
            if not store.runs():
                raise UserError("the store holds no run.", path=str(d))
            judged, not_judged = store.judged_results()
        rows.append(judged)
        not_run.append(not_judged)
    if other is None:
        paths = write_run_report(run_dir, rows[0], f"cuda-l1 report: {run_dir}", tasks_not_run=not_run[0])
        with Store(run_dir / STORE_NAME) as store:
            count = write_verdicts(store, run_dir / VERDICTS_NAME)
        console.print(f"report: {paths['report']}", markup=False)
        console.print(f"verdicts: {run_dir / VERDICTS_NAME} ({count})", markup=False)
        return
    names = tuple(labels.split(",")) if labels else (run_dir.name, other.name)
    if len(names) != 2:
        raise UserError("--labels takes two names separated by a comma.")
    comparison = compare_runs(rows[0], rows[1], labels=names)
    target = out or run_dir
    target.mkdir(parents=True, exist_ok=True)
    written = write_comparison(target, comparison, title=f"{names[0]} vs {names[1]}")
    s = comparison["summary"]
    console.print(f"{s['n_common']} task(s) in both runs; {names[1]} faster on {s['b_faster']}, {names[0]} faster "
                  f"on {s['a_faster']}, equal on {s['same']}", markup=False)
    console.print(f"comparison: {written['compare_html']}  data: {written['compare_json']}", markup=False)
