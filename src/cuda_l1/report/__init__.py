"""Reports: statistics (mean/median/geomean/fast_p), figures, HTML, run comparisons.

    from cuda_l1.report import write_all
    paths = write_all("out/run1", rows)   # summary.json, results.csv, report.html and the PNGs

Rows are `ResultRow`s or dicts (task_id, task_name, level, origin, verdict); see `report.rows`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping, Sequence

from cuda_l1.report import plots as _plots
from cuda_l1.report.compare import compare_runs, compare_section, write_comparison
from cuda_l1.report.html import write_report
from cuda_l1.report.rows import ResultRow, as_row, as_rows, read_results_csv
from cuda_l1.report.aggregates import (
    FAST_P_THRESHOLDS,
    MISSING_RULES,
    TaskOutcome,
    baseline_speedups,
    best_candidate,
    fast_p,
    geomean,
    mean,
    median,
    task_outcomes,
    task_speedups,
)
from cuda_l1.report.summary import build_summary, write_results_csv, write_summary_json


def write_all(
    out_dir: str | Path,
    rows: Iterable[ResultRow | Mapping],
    *,
    missing_as: str = "one",
    origins: Sequence[str] | None = None,
    baselines: Sequence[str] | None = None,
    title: str = "cuda-l1 report",
    notes: Sequence[str] = (),
    plots: bool = True,
    provenance: Mapping | None = None,
    noise: Mapping | None = None,
    tasks_not_run: Mapping[str, Mapping] | None = None,
) -> dict[str, Path]:
    """Write summary.json, results.csv, the figures and report.html into out_dir; return their paths.

    Keys: summary, results, report, and (with plots) hist, tasks, fast_p.
    provenance: what ran, where and when (`report.provenance.provenance()`); noise: the A/A check
    (`bench.noise_summary`). Both go into summary.json and the report as given. tasks_not_run: task id ->
    {"task": its key, "why": ...}, the tasks not judged since their reference does not run here; into
    summary.json and the report's notes.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = as_rows(rows)
    summary = build_summary(rows, missing_as, origins=origins, baselines=baselines)
    if provenance is not None:
        summary["provenance"] = dict(provenance)
    if noise is not None:
        summary["noise"] = dict(noise)
    if tasks_not_run:
        summary["tasks_not_run"] = [{"task_id": task_id, **dict(t)} for task_id, t in tasks_not_run.items()]
        notes = list(notes) + [f"Not judged, and in no figure above: {t['task']} ({task_id}), whose reference does "
                               f"not run here ({t['why'][:300]})" for task_id, t in tasks_not_run.items()]
    paths: dict[str, Path] = {
        "summary": write_summary_json(summary, out_dir / "summary.json"),
        "results": write_results_csv(rows, out_dir / "results.csv", origins=origins),
    }
    figures: dict[str, Path] = {}
    if plots:
        outcomes = task_outcomes(rows, origins)
        figures["hist"] = _plots.plot_speedup_hist(outcomes, out_dir / "speedup_hist.png", missing_as)
        figures["tasks"] = _plots.plot_task_bars(outcomes, out_dir / "task_speedups.png", missing_as)
        figures["fast_p"] = _plots.plot_fast_p(outcomes, out_dir / "fast_p.png")
    paths.update(figures)
    paths["report"] = write_report(out_dir, summary, rows, figures, title=title, notes=notes)
    return paths


__all__ = [
    "FAST_P_THRESHOLDS",
    "MISSING_RULES",
    "ResultRow",
    "TaskOutcome",
    "as_row",
    "as_rows",
    "baseline_speedups",
    "best_candidate",
    "build_summary",
    "compare_runs",
    "compare_section",
    "fast_p",
    "geomean",
    "mean",
    "median",
    "read_results_csv",
    "task_outcomes",
    "task_speedups",
    "write_all",
    "write_comparison",
    "write_report",
    "write_results_csv",
    "write_summary_json",
]
