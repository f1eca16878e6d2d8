"""Report figures as PNG files. Each function writes one file and returns its path.

Figures are drawn on a bare `Figure` with the Agg canvas: no pyplot, so no window ever opens and the
caller's matplotlib backend and global state are left alone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from cuda_l1.report import aggregates

_DPI = 110
_LEVEL_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")
_MISSING_COLOUR = "#bbbbbb"
_MAX_TICK_LABELS = 40  # beyond this many tasks the bar labels would overlap: leave them out


def level_colour(level: int) -> str:
    return _LEVEL_COLOURS[(level - 1) % len(_LEVEL_COLOURS)]


def _speedup_axis(axis) -> None:
    """Log scale with plain labels (0.5x, 1x, 2x) instead of powers of ten."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
    axis.set_minor_formatter(NullFormatter())


def _save(figure: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=_DPI)
    return path


def _no_data(axes, text: str = "no correct candidates") -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, color="#666666")
    axes.set_xticks([])
    axes.set_yticks([])


def plot_speedup_hist(
    results: Iterable,
    path: str | Path,
    missing_as: str = "one",
    origins: Sequence[str] | None = None,
    title: str = "Best speedup per task",
) -> Path:
    """Histogram of each task's best speedup on a log x axis, with a line at 1.0 (as fast as the reference)."""
    aggregates.check_missing_rule(missing_as)
    outcomes = aggregates.outcomes_of(results, origins)
    correct = [o.best_speedup for o in outcomes if o.best_speedup is not None]
    missing = [1.0] * (len(outcomes) - len(correct)) if missing_as == "one" else []
    values = correct + missing
    figure = Figure(figsize=(7, 4))
    axes = figure.add_subplot()
    if not values:
        _no_data(axes)
    else:
        low, high = min(values), max(values)
        if math.isclose(low, high):
            low, high = low / 1.5, high * 1.5  # one value: give the single bar some room
        bins = 30
        ratio = (high / low) ** (1 / bins)
        edges = [low * ratio**i for i in range(bins + 1)]
        edges[-1] = high * 1.0001  # the largest value falls inside the last bin
        axes.hist(
            [correct, missing],
            bins=edges,
            stacked=True,
            color=[_LEVEL_COLOURS[0], _MISSING_COLOUR],
            edgecolor="white",
            label=["best correct candidate", "no correct candidate (1.0)"],
        )
        axes.set_xscale("log")
        _speedup_axis(axes.xaxis)
        axes.axvline(1.0, color="black", linestyle="--", linewidth=1, label="1.0x (reference)")
        axes.set_xlabel("speedup over the reference (log scale)")
        axes.set_ylabel("tasks")
        axes.legend(loc="upper right")
    axes.set_title(f"{title} (n={len(values)}, missing as {missing_as})")
    figure.tight_layout()
    return _save(figure, path)


def origin_colours(origins: Iterable[str]) -> dict[str, str]:
    """One colour per winning origin (strategy or model), in order of first appearance."""
    colours: dict[str, str] = {}
    for origin in origins:
        if origin not in colours:
            colours[origin] = _LEVEL_COLOURS[len(colours) % len(_LEVEL_COLOURS)]
    return colours


def task_bar_data(outcomes: Sequence[aggregates.TaskOutcome], missing_as: str = "one") -> list[tuple]:
    """The bars of `plot_task_bars`, fastest first: (speedup, level, task name, winning origin or None,
    95% interval or None). A task with nothing correct is a bar at 1.0 (missing_as "one") or absent."""
    bars = []
    for outcome in outcomes:
        if outcome.best_speedup is not None:
            bars.append((outcome.best_speedup, outcome.level, outcome.task_name, outcome.best.origin, outcome.best.ci))
        elif missing_as == "one":
            bars.append((1.0, outcome.level, outcome.task_name, None, None))
    bars.sort(key=lambda b: (-b[0], b[1], b[2]))
    return bars


def plot_task_bars(
    results: Iterable,
    path: str | Path,
    missing_as: str = "one",
    origins: Sequence[str] | None = None,
    title: str = "Best speedup per task",
) -> Path:
    """One bar per task (best speedup, sorted), coloured by the strategy or model that won it, with its
    95% interval as a whisker; tasks with nothing correct in hatched grey."""
    bars = task_bar_data(aggregates.outcomes_of(results, origins), missing_as)
    figure = Figure(figsize=(max(7.0, min(0.18 * len(bars) + 2, 30.0)), 4.5))
    axes = figure.add_subplot()
    if not bars:
        _no_data(axes)
    else:
        positions = list(range(len(bars)))
        winners = origin_colours(b[3] for b in bars if b[3] is not None)
        colours = [winners[b[3]] if b[3] is not None else _MISSING_COLOUR for b in bars]
        drawn = axes.bar(positions, [b[0] for b in bars], color=colours, width=0.85)
        for patch, bar in zip(drawn, bars):
            patch.set_hatch("" if bar[3] is not None else "//")
        whiskers = [(i, b[0], b[4]) for i, b in enumerate(bars) if b[4] is not None]
        if whiskers:
            low = [max(h - ci[0], 0.0) for _, h, ci in whiskers]
            high = [max(ci[1] - h, 0.0) for _, h, ci in whiskers]
            axes.errorbar([i for i, _, _ in whiskers], [h for _, h, _ in whiskers], yerr=[low, high], fmt="none",
                          ecolor="black", elinewidth=0.8, capsize=2)
        axes.set_yscale("log")
        _speedup_axis(axes.yaxis)
        axes.axhline(1.0, color="black", linestyle="--", linewidth=1)
        axes.set_ylabel("best speedup (log scale), 95% interval")
        if len(bars) <= _MAX_TICK_LABELS:
            axes.set_xticks(positions)
            axes.set_xticklabels([f"L{b[1]}/{b[2]}" for b in bars], rotation=70, ha="right", fontsize=7)
        else:
            axes.set_xticks([])
            axes.set_xlabel(f"{len(bars)} tasks, sorted by speedup")
        counts = {origin: sum(b[3] == origin for b in bars) for origin in winners}
        handles = [Patch(color=colour, label=f"won by {origin} ({counts[origin]})") for origin, colour in winners.items()]
        if any(b[3] is None for b in bars):
            handles.append(Patch(facecolor=_MISSING_COLOUR, hatch="//", label="no correct candidate (1.0)"))
        axes.legend(handles=handles, loc="upper right", fontsize=8)
    axes.set_title(title)
    figure.tight_layout()
    return _save(figure, path)


def fast_p_curve(outcomes: Sequence[aggregates.TaskOutcome], thresholds: Sequence[float]) -> list[float]:
    """fast_p at each threshold (0.0 for every threshold when there are no tasks)."""
    return [aggregates.fast_p(outcomes, p) or 0.0 for p in thresholds]


def plot_fast_p(
    results: Iterable,
    path: str | Path,
    origins: Sequence[str] | None = None,
    p_max: float | None = None,
    title: str = "fast_p: tasks correct and faster than p",
) -> Path:
    """fast_p as p grows (overall, and per level when there are several), with a line at p = 1."""
    outcomes = aggregates.outcomes_of(results, origins)
    speedups = [o.best_speedup for o in outcomes if o.best_speedup is not None]
    top = p_max if p_max is not None else max([2.0] + [s * 1.05 for s in speedups])
    points = 400
    thresholds = [top * i / points for i in range(points + 1)]
    figure = Figure(figsize=(7, 4))
    axes = figure.add_subplot()
    if not outcomes:
        _no_data(axes, "no tasks")
    else:
        axes.step(thresholds, fast_p_curve(outcomes, thresholds), where="post", color="black", label="all tasks")
        levels = aggregates.by_level(outcomes)
        if len(levels) > 1:
            for level, group in levels.items():
                curve = fast_p_curve(group, thresholds)
                axes.step(thresholds, curve, where="post", color=level_colour(level), label=f"level {level}")
        axes.axvline(1.0, color="#888888", linestyle="--", linewidth=1)
        axes.set_xlim(0, top)
        axes.set_ylim(0, 1.02)
        axes.set_xlabel("speedup threshold p")
        axes.set_ylabel("fraction of tasks")
        axes.legend(loc="upper right", fontsize=8)
    axes.set_title(title)
    figure.tight_layout()
    return _save(figure, path)
