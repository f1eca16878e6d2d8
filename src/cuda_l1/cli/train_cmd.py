"""`cuda-l1 train sft|self-improve|rl --config FILE`: the three training stages, one config file each.

Heavy libraries (transformers, trl, datasets) are imported when a command runs, never at CLI start-up.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import typer
from rich.markup import escape

from cuda_l1.cli.app import app, console, err_console, print_json
from cuda_l1.errors import UserError

train_app = typer.Typer(
    help="Train a model to write faster kernels: sft (stage 1), self-improve (stage 2), rl (stage 3).",
    no_args_is_help=True,
)
app.add_typer(train_app, name="train")

CONFIG_HELP = "Stage config (.toml or .json); `cuda-l1 train defaults STAGE` prints every field with its help."
SET_HELP = "Override a config value, e.g. --set trainer.max_steps=3 --set eval.device=cpu (repeatable)."
STAGES = ("sft", "self-improve", "rl")


def _config_class(stage: str):
    if stage == "sft":
        from cuda_l1.train.sft_config import SFTStageConfig

        return SFTStageConfig
    if stage == "self-improve":
        from cuda_l1.train.self_improve_config import SelfImproveConfig

        return SelfImproveConfig
    if stage == "rl":
        from cuda_l1.train.rl_config import RLStageConfig

        return RLStageConfig
    raise UserError(f"STAGE is one of {', '.join(STAGES)} (got {stage!r}).")


def _check_installed() -> None:
    missing = []
    for name in ("transformers", "trl", "datasets", "accelerate"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise UserError(f"training needs {', '.join(missing)}: pip install 'cuda-l1[train]'.")


def _load(stage: str, config: Path, overrides: list[str] | None, **forced):
    """The stage config, checked: its own fields, the training libraries, and the [trainer] table built
    into TRL's config object now (not after hours of sampling), every error naming the file."""
    from cuda_l1.train.config_files import load_config

    if not config.is_file():
        raise UserError("no such config file.", path=str(config))
    extra = [f"{key}={value}" for key, value in forced.items()]
    cfg = load_config(_config_class(stage), config, list(overrides or []) + extra)
    _check_installed()
    from cuda_l1.train.preflight import check_stage

    try:
        check_stage(stage, cfg)
    except UserError as exc:
        if exc.path is not None:
            raise
        raise UserError(str(exc), path=str(config)) from None
    return cfg


def _run(stage_fn, cfg) -> dict:
    """Run a stage with everything it prints (trainer logs, progress) on stderr: stdout is for the summary."""
    with contextlib.redirect_stdout(sys.stderr):
        return stage_fn(cfg, err_console)


def _report(summary: dict, as_json: bool) -> None:
    if as_json:
        print_json(summary)
        return
    for key, value in summary.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items() if not isinstance(v, (dict, list)))
        console.print(f"[bold]{escape(str(key))}[/]: {escape(str(value))}", highlight=False)


@train_app.command("sft")
def sft_command(
    config: Path = typer.Option(..., "--config", "-c", metavar="FILE", help=CONFIG_HELP),
    data_only: bool = typer.Option(False, "--data-only", help="Only sample and verify data (phases = 'data')."),
    train_only: bool = typer.Option(False, "--train-only", help="Only fine-tune on existing data (phases = 'train')."),
    resume: bool = typer.Option(False, "--resume", help="Continue training from the newest checkpoint."),
    overrides: list[str] = typer.Option(None, "--set", metavar="KEY=VALUE", help=SET_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Stage 1: sample kernels from LLM endpoints for every task, keep the verified ones, fine-tune on them.
    Sampling resumes where a previous run with the same output_dir stopped."""
    if data_only and train_only:
        raise UserError("--data-only and --train-only exclude each other.")
    forced = {}
    if data_only:
        forced["phases"] = '"data"'
    if train_only:
        forced["phases"] = '"train"'
    if resume:
        forced["resume_from_checkpoint"] = '"latest"'
    cfg = _load("sft", config, overrides, **forced)
    from cuda_l1.train.sft_trainer import run_sft

    _report(_run(run_sft, cfg), as_json)


@train_app.command("self-improve")
def self_improve_command(
    config: Path = typer.Option(..., "--config", "-c", metavar="FILE", help=CONFIG_HELP),
    overrides: list[str] = typer.Option(None, "--set", metavar="KEY=VALUE", help=SET_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Stage 2: generate with the current model, keep verified answers (0/1 reward), fine-tune; repeat.
    A rerun continues after the last completed round."""
    cfg = _load("self-improve", config, overrides)
    from cuda_l1.train.self_improve_trainer import run_self_improve

    _report(_run(run_self_improve, cfg), as_json)


@train_app.command("rl")
def rl_command(
    config: Path = typer.Option(..., "--config", "-c", metavar="FILE", help=CONFIG_HELP),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in OUTPUT_DIR/trainer."),
    overrides: list[str] = typer.Option(None, "--set", metavar="KEY=VALUE", help=SET_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Stage 3: contrastive RL (GRPO). Prompts are built from the history store, rewards come from the
    evaluator, and every verdict is written back to the store."""
    cfg = _load("rl", config, overrides, **({"resume_from_checkpoint": '"latest"'} if resume else {}))
    from cuda_l1.train.rl_trainer import run_rl

    _report(_run(run_rl, cfg), as_json)


@train_app.command("tiny-model")
def tiny_model_command(
    out: Path = typer.Option(..., "--out", metavar="DIR", help="Directory to write the model and tokenizer to."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Weight initialisation seed."),
) -> None:
    """Write a tiny random-weight Llama (2 layers, hidden 64) with an in-process BPE tokenizer: a local
    stand-in for a real checkpoint in CPU smoke runs and tests."""
    _check_installed()
    from cuda_l1.train.tiny import TinyModelConfig, build_tiny_model

    path = build_tiny_model(out, TinyModelConfig(seed=seed))
    console.print(f"tiny model written to {path}")


@train_app.command("defaults")
def defaults_command(
    stage: str = typer.Argument(..., metavar="STAGE", help="sft, self-improve or rl."),
) -> None:
    """Print a TOML config for STAGE with every field at its default and a one-line help for each."""
    from cuda_l1.train.config_files import render_template

    typer.echo(render_template(_config_class(stage)), nl=False)
