"""The live progress table: per task, budget spent, work in flight, best speedup so far, last outcome."""

from __future__ import annotations

from typing import Sequence

from rich.live import Live
from rich.table import Table


def _speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


class Display:
    """A rich Live table on stderr (nothing when disabled: JSON output, tests, pipes)."""

    def __init__(self, states: Sequence, enabled: bool, title: str = "optimizing"):
        self.states = states  # TaskState objects, read when drawing
        self.enabled = enabled
        self.title = title
        self._live: Live | None = None

    def table(self) -> Table:
        table = Table(title=self.title, title_justify="left")
        for column in ("task", "done", "asking", "judging", "no code", "best", "from"):
            table.add_column(column, no_wrap=True)
        table.add_column("last", no_wrap=True, overflow="ellipsis", max_width=40)
        for st in self.states:
            table.add_row(st.task.key, f"{st.spent}/{st.budget}", str(st.requesting), str(st.evaluating),
                          str(st.parse_errors), _speedup(st.best), st.best_origin or "-", st.last)
        return table

    def __enter__(self) -> "Display":
        if self.enabled:
            from cuda_l1.cli.app import err_console

            self._live = Live(self.table(), console=err_console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self.table())

    def __exit__(self, *exc) -> bool:
        if self._live is not None:
            self._live.update(self.table())
            self._live.__exit__(*exc)
            self._live = None
        return False
