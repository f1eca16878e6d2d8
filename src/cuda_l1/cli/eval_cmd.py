"""`cuda-l1 eval REFERENCE.py CANDIDATE.py`: one verdict for one candidate."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from cuda_l1.cli import options
from cuda_l1.cli.app import app, console, print_json
from cuda_l1.devices import Device
from cuda_l1.errors import UserError
from cuda_l1.tasks import load_task_file
from cuda_l1.tasks.loaders import not_a_file


def eval_config(device: Device, tolerance: str, quick: bool | None, no_timing: bool = False,
                timeout: float | None = None, module_mode: str = "train"):
    """The EvalConfig the options describe. quick None: quick timing on a CPU, full on a GPU (the batch
    commands' default, which keeps the README's main job within minutes on a CPU)."""
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig
    from cuda_l1.evaluate.tolerance import ToleranceConfig

    if tolerance not in ("oracle", "kernelbench"):
        raise UserError(f"--tolerance is 'oracle' or 'kernelbench' (got {tolerance!r}).")
    if module_mode not in ("train", "eval"):
        raise UserError(f"--module-mode is 'train' or 'eval' (got {module_mode!r}).")
    if quick is None:
        quick = not device.is_cuda
    timing = TimingConfig.quick() if quick else TimingConfig()
    timing.enabled = not no_timing
    config = EvalConfig(device=str(device), tolerance=ToleranceConfig(mode=tolerance), timing=timing,
                        module_mode=module_mode)
    if options.finite_timeout(timeout) is not None:
        config.timeout_s = float(timeout)
    return config


def _read_candidate(path: Path) -> str:
    if not path.is_file():
        raise UserError(not_a_file(path), path=str(path))
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError("not UTF-8 text; a candidate must be a Python source.", path=str(path)) from None


def print_verdict(verdict) -> None:
    colour = "green" if verdict.status == "ok" else "red"
    line = f"[bold {colour}]{verdict.status}[/]"
    if verdict.speedup is not None:
        line += (f"  speedup {verdict.speedup:.2f}x (measured {verdict.raw_speedup:.3f}x, "
                 f"95% CI {verdict.ci[0]:.3f}-{verdict.ci[1]:.3f})  reference {verdict.reference_ms:.4f} ms, "
                 f"candidate {verdict.candidate_ms:.4f} ms")
    console.print(line)
    console.print(f"task {verdict.task_name}  on {verdict.device}  in {verdict.elapsed_s:.1f} s", markup=False)
    for reason in verdict.reasons:  # candidate output and tracebacks: brackets are text, not markup
        console.print(f"[red]- {escape(reason)}[/]", highlight=False)
    table = Table(show_header=True, header_style="bold")
    table.add_column("check")
    table.add_column("outcome")
    table.add_column("detail", overflow="fold")
    for check in verdict.checks:
        mark = {True: "[green]pass[/]", False: "[red]fail[/]" if check.blocking else "[yellow]signal[/]",
                None: "-"}[check.passed]
        table.add_row(escape(check.name), mark, escape(check.detail[:300]))
    console.print(table)
    if verdict.sandbox:
        console.print("sandbox: " + "; ".join(f"{k}: {v}" for k, v in verdict.sandbox.items() if k != "rlimits"),
                      markup=False)


@app.command("eval")
def eval_command(
    reference: Path = typer.Argument(..., metavar="REFERENCE", help="Reference task file (KernelBench format)."),
    candidate: Path = typer.Argument(..., metavar="CANDIDATE", help="Candidate file defining ModelNew."),
    device: str = options.device(),
    as_json: bool = options.as_json("the verdict"),
    tolerance: str = options.tolerance(),
    module_mode: str = options.module_mode(),
    quick: bool = options.quick(),
    no_timing: bool = typer.Option(False, "--no-timing", help="Check correctness and integrity only."),
    timeout: float = options.timeout(),
) -> None:
    """Evaluate CANDIDATE against REFERENCE: isolation, correctness, integrity, timing.

    Exit 0 whenever a verdict was produced, whatever it says; 2 for a broken reference or bad options."""
    from cuda_l1.devices import parse_device

    task = load_task_file(reference)
    source = _read_candidate(candidate)
    target = parse_device(device)
    config = eval_config(target, tolerance, quick, no_timing, timeout, module_mode)
    from cuda_l1.evaluate.jobs import EvalJob
    from cuda_l1.evaluate.local_pool import LocalPool

    # One pool worker judges it, as it judges every batch command's candidates. The task's own code (its
    # import, its reference's run before judging, its inputs) runs there, not here: a task that ends or
    # crashes its process is bad input (BrokenTask, exit 2), where in this process it ended the command
    # with the task's own exit status and no verdict. A broken reference is bad input too, before any
    # candidate code runs.
    with LocalPool(str(target), config, workers=1) as pool:
        with console.status("evaluating…") if not as_json else _null():
            verdict = pool.submit(EvalJob(task, source)).result().verdict
        # Shown before the worker is stopped (its sides and spares closed: about a second).
        print_json(verdict.to_dict()) if as_json else print_verdict(verdict)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
