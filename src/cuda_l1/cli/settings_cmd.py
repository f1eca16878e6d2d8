"""`cuda-l1 settings [NAME]`: every settings field with its default and help, read from field metadata.

The same text makes `docs/configuration.md` (`cuda-l1 settings --markdown`), so neither drifts from
the code. Classes are imported when the command runs: `--help` must not import torch.
"""

from __future__ import annotations

import importlib

import typer
from rich.markup import escape
from rich.table import Table

from cuda_l1.cli.app import app, console, print_json
from cuda_l1.errors import UserError

# name -> (module, class): the top-level settings of each command; nested ones are shown under their key.
SETTINGS = {
    "eval": ("cuda_l1.evaluate.config", "EvalConfig"),
    "build": ("cuda_l1.evaluate.build.build_config", "BuildConfig"),
    "calibration": ("cuda_l1.calibrate", "CalibrationConfig"),
    "search": ("cuda_l1.search.search_config", "SearchConfig"),
    "endpoint": ("cuda_l1.llm.endpoints", "EndpointConfig"),
    "sft": ("cuda_l1.train.sft_config", "SFTStageConfig"),
    "self-improve": ("cuda_l1.train.self_improve_config", "SelfImproveConfig"),
    "rl": ("cuda_l1.train.rl_config", "RLStageConfig"),
    "tiny-model": ("cuda_l1.train.tiny", "TinyModelConfig"),
}

MARKDOWN_HEAD = (
    "# Configuration reference\n\n"
    "Every settings field, its default and its help line, printed from the code by "
    "`cuda-l1 settings --markdown` (a test checks that this file matches). Training stage files "
    "(`cuda-l1 train defaults STAGE`) use the same keys; `[trainer]` tables go to TRL unchanged.\n\n"
)


def settings_class(name: str) -> type:
    """The settings dataclass registered under `name`."""
    if name not in SETTINGS:
        raise UserError(f"NAME is one of {', '.join(SETTINGS)} (got {name!r}).")
    module, cls = SETTINGS[name]
    return getattr(importlib.import_module(module), cls)


def markdown() -> str:
    """The whole configuration reference as Markdown."""
    from cuda_l1.settings import markdown as tables

    return MARKDOWN_HEAD + tables([settings_class(name) for name in SETTINGS])


@app.command("settings")
def settings_command(
    name: str = typer.Argument(None, metavar="[NAME]", help=f"One of: {', '.join(SETTINGS)} (default: all)."),
    as_markdown: bool = typer.Option(False, "--markdown", help="Print the reference as Markdown (docs/configuration.md)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array of {key, type, default, help}."),
) -> None:
    """Show settings fields with their defaults and help."""
    from cuda_l1.settings import describe

    if as_markdown:
        typer.echo(markdown(), nl=False)
        return
    names = [name] if name else list(SETTINGS)
    docs = {n: [vars(d) for d in describe(settings_class(n))] for n in names}
    if as_json:
        print_json(docs if name is None else docs[name])
        return
    for n, rows in docs.items():
        table = Table(title=escape(f"{n}  ({SETTINGS[n][1]})"), title_justify="left")
        for column in ("key", "default", "help"):
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(escape(row["key"]), escape(row["default"]), escape(row["help"]))
        console.print(table)
