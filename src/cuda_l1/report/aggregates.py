"""Statistics over result rows: pure functions, no I/O.

Definitions (the report states them next to the numbers):
- best candidate of a task: the correct (status ok) candidate with the highest speedup; on a tie the
  earliest row wins, so the choice does not depend on anything but the input order;
- fast_p (KernelBench): the fraction of ALL tasks whose best candidate is correct and has speedup > p;
  fast_0 is therefore the correctness rate;
- missing tasks (no correct candidate): `missing_as="one"` counts them as speedup 1.0 in mean, median
  and geomean (the CUDA-L1 paper's rule: the reference itself is always available), `"exclude"`
  leaves them out. fast_p never counts them as fast, whatever the rule;
- speedup over a baseline strategy: per task, the baseline's measured time divided by the best
  candidate's measured time, both from the same run; only tasks where both exist take part.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Iterable, Mapping, Sequence

from cuda_l1.errors import UserError
from cuda_l1.evaluate.verdict import ALL_STATUSES
from cuda_l1.report.rows import ResultRow, as_rows

MISSING_RULES = ("one", "exclude")
FAST_P_THRESHOLDS = (0.0, 1.0, 1.2, 1.5, 2.0)

# Failure statuses from "got furthest" to "failed earliest": a task's status when nothing was correct.
_STATUS_RANK = {status: rank for rank, status in enumerate(ALL_STATUSES)}


def mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def median(values: Iterable[float]) -> float | None:
    values = list(values)
    return float(statistics.median(values)) if values else None


def geomean(values: Iterable[float]) -> float | None:
    """exp(mean(log v)); speedups are ratios, so this is the average that treats 2x and 0.5x symmetrically."""
    values = list(values)
    if not values:
        return None
    if any(v <= 0 for v in values):
        raise ValueError("the geometric mean needs positive values")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def describe(values: Iterable[float]) -> dict:
    """n, mean, median, geomean, min, max of some ratios (None for each when there are none)."""
    values = list(values)
    return {
        "n": len(values),
        "mean": mean(values),
        "median": median(values),
        "geomean": geomean(values),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def fast_p_key(p: float) -> str:
    """JSON key of a threshold: 0 -> "0", 1.0 -> "1", 1.2 -> "1.2"."""
    return f"{p:g}"


def check_missing_rule(missing_as: str) -> str:
    if missing_as not in MISSING_RULES:
        raise UserError(f"missing_as must be one of {', '.join(MISSING_RULES)}, not {missing_as!r}.")
    return missing_as


def matches(origin: str, patterns: Sequence[str] | None) -> bool:
    """Whether a row's origin is one of the candidate origins (shell-style patterns: "llm:*")."""
    return patterns is None or any(fnmatchcase(origin, p) for p in patterns)


def best_candidate(rows: Iterable[ResultRow]) -> ResultRow | None:
    """The correct row with the highest speedup; the earliest on a tie; None when none is correct.

    A correct row whose speedup is unknown still makes the task correct, but loses to any known speedup.
    """
    best: ResultRow | None = None
    for row in rows:
        if not row.ok:
            continue
        if best is None:
            best = row
        elif row.speedup is not None and (best.speedup is None or row.speedup > best.speedup):
            best = row
    return best


@dataclass
class TaskOutcome:
    """Everything measured for one task, and its best candidate."""

    task_id: str
    task_name: str
    level: int
    rows: list[ResultRow] = field(default_factory=list)  # every row of the task (baselines included)
    candidates: list[ResultRow] = field(default_factory=list)  # the rows that compete for "best"
    best: ResultRow | None = None

    @property
    def correct(self) -> bool:
        return self.best is not None

    @property
    def best_speedup(self) -> float | None:
        return self.best.speedup if self.best is not None else None

    @property
    def status(self) -> str:
        """ok when some candidate is correct, else the failure that got furthest (incorrect > … > timeout)."""
        if self.best is not None:
            return self.best.status
        if not self.candidates:
            return "no_candidate"
        return min((r.status for r in self.candidates), key=lambda s: _STATUS_RANK.get(s, len(_STATUS_RANK)))

    def baseline_ms(self, baseline: str) -> float | None:
        """The baseline strategy's time on this task: its fastest correct row of this run, if any.

        The fastest, when a baseline was measured more than once, so a ratio over it never flatters.
        """
        times = [r.candidate_ms for r in self.rows if r.origin == baseline and r.ok and r.candidate_ms]
        return min(times) if times else None

    def over_baseline(self, baseline: str) -> float | None:
        """baseline time / best candidate time, or None when either is missing."""
        base = self.baseline_ms(baseline)
        best = self.best.candidate_ms if self.best is not None else None
        return base / best if base is not None and best is not None else None


def task_outcomes(rows: Iterable[ResultRow | Mapping], origins: Sequence[str] | None = None) -> list[TaskOutcome]:
    """Group rows by task (first-seen order) and pick each task's best among the candidate origins."""
    grouped: dict[str, TaskOutcome] = {}
    for row in as_rows(rows):
        outcome = grouped.get(row.task_id)
        if outcome is None:
            outcome = grouped[row.task_id] = TaskOutcome(row.task_id, row.task_name, row.level)
        outcome.rows.append(row)
        if matches(row.origin, origins):
            outcome.candidates.append(row)
    for outcome in grouped.values():
        outcome.best = best_candidate(outcome.candidates)
    return list(grouped.values())


def outcomes_of(results, origins: Sequence[str] | None = None) -> list[TaskOutcome]:
    """TaskOutcomes as given, or built from rows (ResultRow or dicts)."""
    results = list(results)
    if results and all(isinstance(r, TaskOutcome) for r in results):
        return results
    return task_outcomes(results, origins)


def task_speedups(results, missing_as: str = "one", origins: Sequence[str] | None = None) -> list[float]:
    """The best speedup of every task, with tasks lacking one handled by the missing rule."""
    check_missing_rule(missing_as)
    values = []
    for outcome in outcomes_of(results, origins):
        value = outcome.best_speedup
        if value is not None:
            values.append(value)
        elif missing_as == "one":
            values.append(1.0)
    return values


def fast_p(results, p: float, origins: Sequence[str] | None = None) -> float | None:
    """Fraction of all tasks whose best candidate is correct with speedup > p (None: no tasks).

    `results` is rows (ResultRow or dicts) or TaskOutcomes. fast_0 is the correctness rate: a correct
    candidate whose speedup is unknown counts only there.
    """
    outcomes = outcomes_of(results, origins)
    if not outcomes:
        return None
    fast = 0
    for outcome in outcomes:
        if not outcome.correct:
            continue
        value = outcome.best_speedup
        if (value is not None and value > p) or (value is None and p <= 0):
            fast += 1
    return fast / len(outcomes)


def baseline_speedups(results, baseline: str, origins: Sequence[str] | None = None) -> list[float]:
    """Per task, baseline time / best candidate time, for the tasks where both were measured."""
    values = (o.over_baseline(baseline) for o in outcomes_of(results, origins))
    return [v for v in values if v is not None]


def by_level(outcomes: Iterable[TaskOutcome]) -> dict[int, list[TaskOutcome]]:
    """Outcomes split by level, levels in increasing order."""
    levels: dict[int, list[TaskOutcome]] = {}
    for outcome in outcomes:
        levels.setdefault(outcome.level, []).append(outcome)
    return dict(sorted(levels.items()))
