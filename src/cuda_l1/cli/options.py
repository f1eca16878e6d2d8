"""Options shared by the commands that evaluate (eval, bench, audit, optimize), defined once.

Each function returns a fresh typer.Option, since typer keeps one per parameter. Metavars name what a
value is (DEVICE, SECONDS), so help and usage errors read without type placeholders.
"""

from __future__ import annotations

import typer

# EvalConfig.timeout_s and task_timeout_s; repeated here so that `--help` need not import torch (tests
# check they agree).
DEFAULT_TIMEOUT_S = 180.0
DEFAULT_TASK_TIMEOUT_S = 300.0


def device() -> typer.models.OptionInfo:
    return typer.Option(None, "--device", metavar="DEVICE",
                        help="cpu, cuda (all visible GPUs), cuda:N or auto; default: cuda if this host has a GPU, else cpu "
                        "(with --cluster ray, cuda and auto mean the cluster's GPUs).")


def tolerance() -> typer.models.OptionInfo:
    return typer.Option("oracle", "--tolerance", metavar="MODE",
                        help="oracle (checked against a float64 reference) or kernelbench (its atol/rtol).")


def module_mode(default: str = "train") -> typer.models.OptionInfo:
    return typer.Option(default, "--module-mode", metavar="MODE",
                        help="train (both models as constructed, as KernelBench's harness runs them: BatchNorm "
                        "normalises with the batch's statistics) or eval (model.eval() on both first, as "
                        "CUDA-L1's harness does: running statistics, no dropout).")


def quick() -> typer.models.OptionInfo:
    return typer.Option(False, "--quick", help="Short timing: fewer rounds, 4 s at most per candidate "
                        "(smoke runs; speedups less precise).")


def batch_timing() -> typer.models.OptionInfo:
    return typer.Option(None, "--quick/--full",
                        help="Timing: --quick (fewer rounds, 4 s at most per candidate) or --full (the whole "
                        "protocol). Default: --quick on a CPU, --full on a GPU.")


def timeout() -> typer.models.OptionInfo:
    return typer.Option(None, "--timeout", metavar="SECONDS", min=1.0,
                        help=f"Wall-clock limit for one candidate's whole evaluation (load, checks, timing); "
                        f"past it the verdict is timeout. Default {DEFAULT_TIMEOUT_S:g}. The task's own code "
                        f"(its import, inputs, first run) has a deadline of its own, "
                        f"{DEFAULT_TASK_TIMEOUT_S:g} s each (settings: task_timeout_s).")


def finite_timeout(seconds: float | None) -> float | None:
    """`--timeout` as given, or UserError for one that never comes (inf: the option's minimum takes it;
    nan fails the minimum): a deadline that never comes holds what waits on it for good."""
    import math

    from cuda_l1.errors import UserError

    if seconds is not None and not math.isfinite(seconds):
        raise UserError(f"--timeout takes a finite number of seconds (got {seconds}).")
    return seconds


def workers() -> typer.models.OptionInfo:
    return typer.Option(None, "--workers", metavar="N", min=1,
                        help="Evaluation workers (default: one per GPU; 1 on CPU; at most one per GPU or usable core).")


def cluster() -> typer.models.OptionInfo:
    return typer.Option("local", "--cluster", metavar="WHERE", help="local, ray or ray://ADDRESS.")


def levels() -> typer.models.OptionInfo:
    return typer.Option(None, "--levels", metavar="LEVELS", help="Only these levels, e.g. 1,2.")


def calibrate() -> typer.models.OptionInfo:
    return typer.Option(None, "--calibrate/--no-calibrate", show_default=False,
                        help="First time the reference against itself on a few tasks (A/A), to show how "
                        "far identical code strays on this host; results on a host too noisy are marked. "
                        "Default: on, except in a run of the eager strategy, whose eager verdicts are such "
                        "a check already (--calibrate runs it there too).")


def as_json(what: str) -> typer.models.OptionInfo:
    return typer.Option(False, "--json", help=f"Print {what} as JSON.")


def rejudge() -> typer.models.OptionInfo:
    return typer.Option("", "--rejudge", metavar="STATUSES",
                        help="Judge again the stored verdicts of these statuses (comma-separated, e.g. "
                        "runtime_error,timeout) instead of keeping them; each new verdict notes the one it replaced.")


def verdicts_from() -> typer.models.OptionInfo:
    return typer.Option(None, "--verdicts-from", metavar="FILE",
                        help="A verdicts.jsonl (written by bench, audit and report): its verdicts are taken for the "
                        "same programs on the same device under the same settings instead of judging them again (a .gz file is "
                        "read as gzip).")


def parse_statuses(text: str) -> frozenset[str]:
    """--rejudge's statuses, each checked (a typo must not silently judge nothing again)."""
    from cuda_l1.errors import UserError
    from cuda_l1.evaluate.verdict import STATUSES

    chosen = frozenset(s.strip() for s in text.split(",") if s.strip())
    unknown = sorted(chosen - set(STATUSES))
    if unknown:
        raise UserError(f"--rejudge: unknown status {', '.join(unknown)}; the statuses are {', '.join(STATUSES)}.")
    return chosen
