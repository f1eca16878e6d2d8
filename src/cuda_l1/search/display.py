"""The live progress table: per task, budget spent, work in flight, best speedup so far, last outcome.

On a terminal it is a rich Live table; otherwise (a log file, a pipe, CI) it prints one flushed line
each time a task's outcome changes, since a Live table off a terminal shows nothing until the end.
"""

from __future__ import annotations

import sys
import time
from typing import Sequence, TextIO

from rich.live import Live
from rich.markup import escape
from rich.table import Table

from cuda_l1.progress import clock


def _speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


class Display:
    """Progress of the optimisation loop on stderr (nothing when disabled: tests)."""

    def __init__(self, states: Sequence, enabled: bool, title: str = "optimizing", stream: TextIO | None = None):
        self.states = states  # TaskState objects, read when drawing
        self.enabled = enabled
        self.title = title
        self.stream = stream or sys.stderr
        self._live: Live | None = None
        self._plain = False
        self._shown: dict[str, str] = {}  # task key -> last outcome printed (plain mode)
        self._started = time.monotonic()

    def table(self) -> Table:
        table = Table(title=escape(self.title), title_justify="left")
        for column in ("task", "done", "asking", "judging", "no code", "best", "from"):
            table.add_column(column, no_wrap=True)
        table.add_column("last", no_wrap=True, overflow="ellipsis", max_width=40)
        for st in self.states:  # keys, origins and outcomes are text: brackets are not markup
            table.add_row(escape(st.task.key), f"{st.spent}/{st.budget}", str(st.requesting), str(st.evaluating),
                          str(st.parse_errors), _speedup(st.best), escape(st.best_origin or "-"), escape(st.last))
        return table

    def __enter__(self) -> "Display":
        self._started = time.monotonic()
        if not self.enabled:
            return self
        if _is_terminal(self.stream):
            from rich.console import Console

            self._live = Live(self.table(), console=Console(file=self.stream), refresh_per_second=4, transient=False)
            self._live.__enter__()
        else:
            self._plain = True
            self._write(f"{self.title}: {len(self.states)} task(s)")
        return self

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self.table())
        elif self._plain:
            self._print_changes()

    def _print_changes(self) -> None:
        spent = sum(st.spent for st in self.states)
        budget = sum(st.budget for st in self.states)
        for st in self.states:
            if st.last and st.last != "evaluating" and self._shown.get(st.task.key) != _line_key(st):
                self._shown[st.task.key] = _line_key(st)
                self._write(f"[{spent}/{budget} completions] {st.task.key}: {st.last} (best {_speedup(st.best)}"
                            f"{' from ' + st.best_origin if st.best_origin else ''}; "
                            f"{clock(time.monotonic() - self._started)} elapsed)")

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def __exit__(self, *exc) -> bool:
        if self._live is not None:
            self._live.update(self.table())
            self._live.__exit__(*exc)
            self._live = None
        elif self._plain:
            self._print_changes()
            self._plain = False
        return False


def _line_key(st) -> str:
    """What makes a task's line worth printing again: its outcome and its counts."""
    return f"{st.last}|{st.spent}|{st.evaluated}|{st.reused}|{st.parse_errors}"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
