"""The typer application and the error policy shared by every command.

Bad input raises UserError somewhere below, and usage errors (an unknown command or option, a missing
argument, a value of the wrong type) come from typer's parser; both become one paragraph on stderr and
exit code 2, never a traceback. A run that could not do its work raises RunError: exit code 1. What no check
foresaw is still one paragraph (`_unforeseen`): a path that cannot be used or a damaged history store
exits 2, anything else 1; CUDA_L1_TRACEBACK=1 shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sqlite3
import sys
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from cuda_l1 import __version__
from cuda_l1.errors import RunError, UserError

PROG = "cuda-l1"

# typer >= 0.26 parses with its own copy of click and, in rich help, prints a type column ("<bool>",
# "<list[Path]>") that reads as noise: plain help there. Earlier versions escape brackets in plain
# help ("\\[required]"), so they keep their default.
_HELP_STYLE = {"rich_markup_mode": None} if importlib.util.find_spec("typer._click") else {}

app = typer.Typer(
    name=PROG,
    help="Make PyTorch modules faster with LLM-written CUDA, measured by an evaluator that cannot be gamed.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    **_HELP_STYLE,
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


def print_error(message: str) -> None:
    """One paragraph on stderr. The message is escaped: a hint such as pip install 'cuda-l1[train]'
    must keep its brackets."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def parser_exceptions() -> tuple[type, type, type]:
    """(Exit, Abort, ClickException) of the click that the installed typer parses with.

    typer >= 0.26 carries its own copy of click (typer._click) and raises those classes; earlier
    versions raise the click package's. typer exports Exit, Abort and BadParameter in both cases, and
    ClickException is a base of BadParameter, so it is found without importing either click."""
    base = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    return typer.Exit, typer.Abort, base


def usage_paragraph(exc: Exception) -> str:
    """A parser error as one paragraph: what is wrong, the usage line, and where help is."""
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return message
    usage = " ".join(ctx.get_usage().split())  # "Usage: cuda-l1 eval [OPTIONS] REFERENCE CANDIDATE"
    message = message.strip()
    if not message.endswith((".", "?", "!")):
        message += "."
    return f"{message} {usage}; see '{ctx.command_path} --help'."


def os_error_text(exc: OSError) -> str:
    """What an OSError says about which path, without a traceback: "runs/x/summary.json: Is a directory"."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    what = exc.strerror or str(exc)
    return f"{where}: {what}" if where else what


def _unforeseen(exc: BaseException) -> int:
    """A failure that no check below turned into a UserError or RunError, as one paragraph and an exit
    code: a path that cannot be used (2), a history store that is busy (1) or damaged (2), anything
    else (1). CUDA_L1_TRACEBACK=1 shows the traceback instead."""
    if os.environ.get("CUDA_L1_TRACEBACK"):
        raise exc
    if isinstance(exc, BrokenPipeError):  # `cuda-l1 ... --json | head`: the reader left, nothing to say
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    if isinstance(exc, OSError) and exc.filename is not None:  # a directory where a file goes, an unreadable file
        print_error(os_error_text(exc))
        return 2
    if isinstance(exc, sqlite3.OperationalError) and any(w in str(exc) for w in ("locked", "busy")):
        print_error(f"a history store is busy ({exc}): another process is writing it; try again")
        return 1
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.IntegrityError):
        print_error(f"a history store could not be read or written ({exc}); it may be damaged, or not one "
                    "that this version writes")
        return 2
    print_error(f"unexpected {type(exc).__name__}: {exc or '(no message)'} (set CUDA_L1_TRACEBACK=1 to see "
                "where it was raised)")
    return 1


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _first_said(group: BaseExceptionGroup) -> UserError | RunError | None:
    """The first UserError or RunError in an exception group (nested groups searched in order)."""
    for exc in group.exceptions:
        found = _first_said(exc) if isinstance(exc, BaseExceptionGroup) else exc
        if isinstance(found, (UserError, RunError)):
            return found
    return None


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and turn every user-facing failure into an exit code."""
    exit_cls, abort_cls, click_exc = parser_exceptions()
    try:
        # Not standalone: errors come back here, so every version of typer ends in the same messages.
        code = app(args=argv, prog_name=PROG, standalone_mode=False)
    except UserError as exc:
        print_error(str(exc))
        return exc.exit_code
    except RunError as exc:
        print_error(str(exc))
        return exc.exit_code
    except BaseExceptionGroup as group:  # an asyncio TaskGroup's (optimize's loop): bad input said as such
        said = _first_said(group)
        if said is not None:
            print_error(str(said))
            return said.exit_code
        if not isinstance(group, ExceptionGroup):  # a KeyboardInterrupt or SystemExit inside: theirs to end
            raise
        return _unforeseen(_first_leaf(group))
    except exit_cls as exc:
        return exc.exit_code
    except abort_cls:
        err_console.print("[red]aborted[/]")
        return 130
    except click_exc as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `cuda-l1` or `cuda-l1 tasks` alone: the help
            exc.show()
            return exc.exit_code
        print_error(usage_paragraph(exc))
        return exc.exit_code  # 2 for usage errors
    except KeyboardInterrupt:
        err_console.print("[red]interrupted[/]")
        return 130
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one paragraph, never a traceback
        return _unforeseen(exc)
    # Without standalone mode, click returns the code of typer.Exit(code) instead of raising it.
    code = code if isinstance(code, int) and not isinstance(code, bool) else 0
    if code == 130:  # typer's silent Exit(130) for Ctrl-C (no command of ours exits with 130)
        err_console.print("[red]interrupted[/]")
    return code
