"""The run summary: overall and per-level statistics as one JSON-ready dict, plus the CSV/JSON writers."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from cuda_l1.evaluate.verdict import ALL_STATUSES
from cuda_l1.report import aggregates
from cuda_l1.report.rows import ResultRow, as_rows
from cuda_l1.report.rows import write_results_csv as _write_rows_csv
from cuda_l1.strategies import baseline_names

SUMMARY_VERSION = 1  # bump when the structure of summary.json changes


def rule_texts(missing_as: str, origins: Sequence[str] | None) -> dict:
    """The rules behind every number, in words, so the report can print them beside the tables."""
    missing = {
        "one": "tasks with no correct candidate count as speedup 1.0 in mean, median and geomean "
        "(the reference itself is always available; the CUDA-L1 paper's rule)",
        "exclude": "tasks with no correct candidate are left out of mean, median and geomean",
    }[missing_as]
    candidates = "all rows" if origins is None else "rows whose origin matches " + ", ".join(origins)
    return {
        "missing_as": missing_as,
        "missing": missing,
        "best": "per task, the correct candidate with the highest speedup (earliest row on a tie)",
        "fast_p": "fraction of all tasks whose best candidate is correct with speedup > p "
        "(KernelBench; fast_0 is the correctness rate; missing tasks never count)",
        "over_baseline": "per task, the baseline strategy's time / the best candidate's time, both "
        "measured in this run; only tasks where both exist take part (n)",
        "candidates": candidates,
    }


def _status_counts(rows: Iterable[ResultRow]) -> dict[str, int]:
    counts = Counter(r.status for r in rows)
    ordered = {s: counts.pop(s, 0) for s in ALL_STATUSES}
    ordered.update(sorted(counts.items()))  # statuses this version does not know, kept rather than lost
    return ordered


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def group_summary(
    outcomes: list[aggregates.TaskOutcome],
    missing_as: str,
    baselines: Sequence[str],
    thresholds: Sequence[float] = aggregates.FAST_P_THRESHOLDS,
) -> dict:
    """Statistics of one group of tasks (all of them, or one level)."""
    candidates = [r for o in outcomes for r in o.candidates]
    n_correct = sum(o.correct for o in outcomes)
    best_origins = Counter(o.best.origin for o in outcomes if o.best is not None)
    return {
        "n_tasks": len(outcomes),
        "n_correct": n_correct,
        "n_missing": len(outcomes) - n_correct,
        "n_candidates": len(candidates),
        "correct_rate": _rate(n_correct, len(outcomes)),
        "candidate_ok_rate": _rate(sum(r.ok for r in candidates), len(candidates)),
        "speedup": aggregates.describe(aggregates.task_speedups(outcomes, missing_as)),
        "fast_p": {aggregates.fast_p_key(p): aggregates.fast_p(outcomes, p) for p in thresholds},
        "status_counts": _status_counts(candidates),
        "over_baseline": {b: aggregates.describe(aggregates.baseline_speedups(outcomes, b)) for b in baselines},
        "best_origins": dict(best_origins.most_common()),
    }


def task_summary(outcome: aggregates.TaskOutcome, baselines: Sequence[str]) -> dict:
    """One task's line in the report: its best candidate, or why nothing was correct."""
    best = outcome.best
    shown = best or _furthest_failure(outcome)
    return {
        "task_id": outcome.task_id,
        "task_name": outcome.task_name,
        "level": outcome.level,
        "status": outcome.status,
        "best_origin": best.origin if best else None,
        "speedup": best.speedup if best else None,
        "ci": list(best.ci) if best and best.ci else None,
        "reference_ms": shown.reference_ms if shown else None,
        "best_ms": best.candidate_ms if best else None,
        "n_candidates": len(outcome.candidates),
        "status_counts": {k: v for k, v in _status_counts(outcome.candidates).items() if v},
        "over_baseline": {b: outcome.over_baseline(b) for b in baselines},
        "reasons": [] if best or shown is None else list(shown.verdict.reasons),
    }


def _furthest_failure(outcome: aggregates.TaskOutcome) -> ResultRow | None:
    failed = [r for r in outcome.candidates if r.status == outcome.status]
    return failed[0] if failed else None


def build_summary(
    rows: Iterable[ResultRow | Mapping],
    missing_as: str = "one",
    *,
    origins: Sequence[str] | None = None,
    baselines: Sequence[str] | None = None,
    thresholds: Sequence[float] = aggregates.FAST_P_THRESHOLDS,
) -> dict:
    """Overall and per-level statistics of a run.

    origins: shell-style patterns of the origins that compete for "best" (e.g. ["llm:*"]); None: all.
    baselines: strategies to measure the best candidate against; default `baseline_names()`.
    """
    aggregates.check_missing_rule(missing_as)
    rows = as_rows(rows)
    baselines = list(baseline_names() if baselines is None else baselines)
    outcomes = aggregates.task_outcomes(rows, origins)
    return {
        "version": SUMMARY_VERSION,
        "rules": rule_texts(missing_as, origins),
        "candidate_origins": list(origins) if origins is not None else None,
        "baselines": baselines,
        "fast_p_thresholds": [float(p) for p in thresholds],
        "n_rows": len(rows),
        "overall": group_summary(outcomes, missing_as, baselines, thresholds),
        "levels": {
            str(level): group_summary(group, missing_as, baselines, thresholds)
            for level, group in aggregates.by_level(outcomes).items()
        },
        "tasks": [task_summary(o, baselines) for o in outcomes],
    }


def best_row_indices(rows: Sequence[ResultRow], origins: Sequence[str] | None = None) -> set[int]:
    """Positions in `rows` of each task's best candidate."""
    best_ids = {id(o.best) for o in aggregates.task_outcomes(rows, origins) if o.best is not None}
    return {i for i, row in enumerate(rows) if id(row) in best_ids}


def write_results_csv(
    rows: Iterable[ResultRow | Mapping], path: str | Path, origins: Sequence[str] | None = None
) -> Path:
    """results.csv: one line per candidate, with a `best` column marking each task's best."""
    rows = as_rows(rows)
    return _write_rows_csv(rows, path, best=best_row_indices(rows, origins))


def _json_ready(value):
    """NaN and infinity are not JSON: write them as null rather than emit an unreadable file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value


def write_summary_json(summary: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_json_ready(summary), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path
