"""`cuda-l1 calibrate SOURCE`, and the same A/A check at the start of `bench` and `optimize`."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.markup import escape

from cuda_l1.cli import options
from cuda_l1.cli.app import app, console, err_console, print_json
from cuda_l1.devices import Device, parse_device
from cuda_l1.errors import UserError
from cuda_l1.tasks import for_device, parse_levels


def eager_is_the_noise_check(strategies) -> bool:
    """Whether a run's own eager candidates stand for the A/A check: the eager strategy times each
    task's reference against itself, as the check does on a few tasks, and the report judges their
    spread the same way (calibrate.eager_spread), printed with the results. The check first cost a
    KernelBench run 37 s of an H200 call, for an answer its first eager verdicts give."""
    return "eager" in strategies


def noise_check(tasks: list, config, device: Device, out: Path | None, *, quiet: bool, count: int = 3,
                quick: bool = True) -> dict | None:
    """Run the A/A check on a few of `tasks`; print each point as it comes (stderr) and the verdict;
    save it to OUT/calibration.json when a run directory is given. None when the GPUs are a cluster's
    (this host has none to time on)."""

    from cuda_l1.calibrate import CalibrationConfig, point_line, run_calibration, save_calibration, verdict_text

    if device.remote:
        if not quiet:
            err_console.print("noise check skipped: the GPUs are the cluster's, not this host's.", markup=False)
        return None

    def show(point: dict) -> None:
        if not quiet:
            sys.stderr.write(f"noise check: {point_line(point)}\n")
            sys.stderr.flush()

    if not quiet:
        err_console.print(f"noise check: the reference against itself on {min(count, len(tasks))} task(s)…",
                          markup=False, highlight=False)
    result = run_calibration(tasks, config, CalibrationConfig(tasks=count, quick=quick), on_point=show)
    if out is not None:
        save_calibration(out, result)
    if not quiet:
        colour = "bold red" if result["too_noisy"] else "green"
        err_console.print(f"[{colour}]{escape(verdict_text(result))}[/]", highlight=False, soft_wrap=True)
    return result


@app.command("calibrate")
def calibrate_command(
    source: str = typer.Argument("builtin", metavar="SOURCE", help="Tasks: 'builtin', a KernelBench directory, "
                                 "a task .py file or a .jsonl solution set."),
    count: int = typer.Option(3, "--tasks", metavar="N", min=1, help="Tasks to time the reference against itself on."),
    levels: str = options.levels(),
    device: str = options.device(),
    full: bool = typer.Option(False, "--full", help="Time with the full protocol instead of quick timing."),
    timeout: float = options.timeout(),
    out: Path = typer.Option(None, "--out", metavar="DIR", help="Also save the check to DIR/calibration.json "
                             "(a run directory: its next report shows it)."),
    as_json: bool = options.as_json("the check"),
) -> None:
    """Time the unchanged reference against itself (A/A) on a few tasks: how far identical code strays on
    this host, and whether that is too far to trust a speedup measured here."""
    from cuda_l1.bench import select_tasks
    from cuda_l1.reference_runs import check_references
    from cuda_l1.calibrate import pick_tasks
    from cuda_l1.cli.eval_cmd import eval_config

    target = parse_device(device)
    config = eval_config(target, "oracle", not full, timeout=timeout)
    if out is not None:  # a run directory that cannot be made is found before the minutes of measuring, not after
        if out.exists() and not out.is_dir():
            raise UserError("--out is a run directory, and this is a file.", path=str(out))
        out.mkdir(parents=True, exist_ok=True)  # (an OSError: one paragraph naming the path, exit 2)
    tasks = pick_tasks(select_tasks(for_device(source, target), parse_levels(levels)), count)
    check_references(tasks, target, timeout_s=config.task_timeout_s)
    result = noise_check(tasks, config, target, out, quiet=as_json, count=count, quick=not full)
    if result is None:
        raise UserError("calibrate times on this host's devices; --device cuda needs a visible GPU here.")
    if as_json:
        print_json(result)
    else:
        console.print(f"{result['n']} task(s) in {result['elapsed_s']:.0f} s on {result['device']}", markup=False)
