"""The typer application and the error policy shared by every command.

Bad input raises UserError somewhere below; here it becomes one coloured paragraph on stderr and exit
code 2, never a traceback.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
import typer
from rich.console import Console

from cuda_l1 import __version__
from cuda_l1.errors import UserError

app = typer.Typer(
    name="cuda-l1",
    help="Make PyTorch modules faster with LLM-written CUDA, measured by an evaluator that cannot be gamed.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

console = Console()
err_console = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        console.print(f"cuda-l1 {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """cuda-l1: an open implementation of CUDA-L1 (contrastive-RL CUDA optimization)."""


def print_json(data: Any) -> None:
    """Machine-readable output goes to stdout unadorned, so it pipes into jq and friends."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and turn every user-facing failure into an exit code."""
    try:
        app(args=argv, standalone_mode=False)
        return 0
    except UserError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        err_console.print("[red]aborted[/]")
        return 130
    except click.ClickException as exc:
        exc.show()
        return 2
    except KeyboardInterrupt:
        err_console.print("[red]interrupted[/]")
        return 130
