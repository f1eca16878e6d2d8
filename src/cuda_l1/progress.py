"""Progress of a batch of evaluations: a live bar on a terminal, one flushed line per verdict otherwise.

The time left is estimated from the whole run so far (elapsed / done x left): an evaluation takes
seconds to minutes, longer than the few seconds rich's own estimate looks back over, which is why
that one never showed anything but -:--:--.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def clock(seconds: float | None) -> str:
    """0:07:05 for 425 s; '?' when unknown."""
    if seconds is None:
        return "?"
    seconds = int(round(max(seconds, 0)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def time_left(elapsed: float, done: int, total: int) -> float | None:
    """The run's average pace so far applied to what is left; None before the first result."""
    if done <= 0 or total <= 0:
        return None
    return elapsed / done * max(total - done, 0)


def plain_line(done: int, total: int, elapsed: float, text: str) -> str:
    left = time_left(elapsed, done, total)
    tail = "" if done >= total else f", about {clock(left)} left"
    return f"[{done}/{total}] {text}  ({clock(elapsed)} elapsed{tail})"


def _eta_column():
    from rich.progress import ProgressColumn
    from rich.text import Text

    class EstimateColumn(ProgressColumn):
        """'eta 0:04:10' from the task's whole elapsed time, however slow each step is."""

        def render(self, task) -> Text:
            left = time_left(task.elapsed or 0.0, int(task.completed), int(task.total or 0))
            return Text(f"eta {clock(left)}" if left is not None else "eta …", style="progress.remaining")

    return EstimateColumn()


class EvalProgress:
    """Context manager: `advance(text)` once per finished evaluation.

    mode: "bar" (rich, on a terminal), "lines" (plain text, for logs and pipes) or "off";
    None picks bar or lines by whether the stream is a terminal."""

    def __init__(self, total: int, *, enabled: bool = True, mode: str | None = None, label: str = "evaluating",
                 stream: TextIO | None = None):
        self.total, self.label = total, label
        self.stream = stream or sys.stderr
        if not enabled:
            mode = "off"
        elif mode is None:
            mode = "bar" if _is_terminal(self.stream) else "lines"
        self.mode = mode
        self.done = 0
        self.started = time.monotonic()

    def __enter__(self) -> "EvalProgress":
        self.started = time.monotonic()
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            console = Console(file=self.stream)
            # markup=False: task keys and strategy labels are shown as they are, brackets included.
            self._bar = Progress(TextColumn(f"[bold]{self.label}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), _eta_column(),
                                 TextColumn("{task.description}", markup=False), console=console)
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=self.total)
        elif self.mode == "lines":
            self._write(f"{self.label} {self.total} candidate(s)")
        return self

    def advance(self, text: str) -> None:
        self.done += 1
        if self.mode == "bar":
            self._bar.update(self._task, advance=1, description=text)
        elif self.mode == "lines":
            self._write(plain_line(self.done, self.total, time.monotonic() - self.started, text))

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()  # a log followed with tail -f shows each verdict as it comes

    def __exit__(self, *exc) -> bool:
        if self.mode == "bar":
            self._bar.__exit__(*exc)
        return False


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
