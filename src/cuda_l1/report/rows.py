"""Result rows: one evaluated candidate each (which task, where it came from, the verdict), and CSV I/O.

Reports accept rows as `ResultRow` objects or as plain dicts (from JSON, the store, or a results CSV);
`as_row` turns either into a `ResultRow`.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from cuda_l1.errors import UserError
from cuda_l1.evaluate.verdict import Verdict

# Verdict fields a flat dict may carry next to the task fields (a results CSV row, for one).
_VERDICT_KEYS = ("status", "speedup", "raw_speedup", "reference_ms", "candidate_ms", "ci", "reasons", "device")

CSV_COLUMNS = (
    "task_id",
    "task_name",
    "level",
    "origin",
    "candidate_id",
    "status",
    "speedup",
    "raw_speedup",
    "reference_ms",
    "candidate_ms",
    "ci_low",
    "ci_high",
    "device",
    "best",
    "reasons",
)
_REASON_SEPARATOR = " | "


@dataclass
class ResultRow:
    """One evaluated candidate."""

    task_id: str  # content hash of the task source (falls back to the task name when unknown)
    task_name: str  # e.g. "19_ReLU"
    level: int  # KernelBench level; 0 when unknown
    origin: str  # the strategy ("eager", "compile", …) or policy ("llm:model-x") that wrote the candidate
    verdict: Verdict  # what the evaluator said
    candidate_id: str = ""  # id of the candidate's exact source (tasks.code_id), when known
    extra: dict = field(default_factory=dict)  # anything else the caller wants carried along

    @property
    def status(self) -> str:
        return self.verdict.status

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    @property
    def speedup(self) -> float | None:
        """The verdict's speedup when the candidate is ok and the speedup is a usable positive number."""
        value = self.verdict.speedup
        if not self.ok or value is None:
            return None
        value = float(value)
        return value if math.isfinite(value) and value > 0 else None

    @property
    def reference_ms(self) -> float | None:
        return _positive(self.verdict.reference_ms)

    @property
    def candidate_ms(self) -> float | None:
        """The candidate's measured time; only meaningful (and only returned) for ok verdicts."""
        return _positive(self.verdict.candidate_ms) if self.ok else None

    @property
    def ci(self) -> tuple[float, float] | None:
        ci = self.verdict.ci
        if ci and len(ci) == 2 and ci[0] is not None and ci[1] is not None:
            return float(ci[0]), float(ci[1])
        return None


def _positive(value: Any) -> float | None:
    if value is None or value == "":
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def _optional_float(value: Any) -> float | None:
    if value is None or (isinstance(value, str) and value.strip() in ("", "None", "null")):
        return None
    return float(value)


def _verdict_from_flat(data: Mapping) -> Verdict:
    ci = data.get("ci")
    if ci is None and ("ci_low" in data or "ci_high" in data):
        low, high = _optional_float(data.get("ci_low")), _optional_float(data.get("ci_high"))
        ci = [low, high] if low is not None and high is not None else None
    reasons = data.get("reasons") or []
    if isinstance(reasons, str):
        reasons = [r for r in reasons.split(_REASON_SEPARATOR) if r]
    return Verdict(
        status=str(data["status"]),
        speedup=_optional_float(data.get("speedup")),
        raw_speedup=_optional_float(data.get("raw_speedup")),
        reference_ms=_optional_float(data.get("reference_ms")),
        candidate_ms=_optional_float(data.get("candidate_ms")),
        ci=ci,
        reasons=list(reasons),
        device=str(data.get("device") or ""),
    )


def as_row(item: ResultRow | Mapping) -> ResultRow:
    """A ResultRow from a ResultRow or a dict.

    A dict gives task_id, task_name, level, origin (or strategy), and either `verdict` (a Verdict or
    its dict) or the verdict's fields flat (status, speedup, reference_ms, candidate_ms, ci or
    ci_low/ci_high, reasons). Task id and name fall back to the verdict's own.
    """
    if isinstance(item, ResultRow):
        return item
    if not isinstance(item, Mapping):
        raise UserError(f"a result row must be a ResultRow or a dict, not {type(item).__name__}.")
    verdict = item.get("verdict")
    if isinstance(verdict, Mapping):
        verdict = Verdict.from_dict(dict(verdict))
    elif verdict is None:
        if "status" not in item:
            raise UserError(f"result row {dict(item)!r} has neither a verdict nor a status.")
        verdict = _verdict_from_flat(item)
    elif not isinstance(verdict, Verdict):
        raise UserError(f"result row verdict must be a Verdict or a dict, not {type(verdict).__name__}.")
    task_name = str(item.get("task_name") or verdict.task_name or "")
    task_id = str(item.get("task_id") or verdict.task_id or task_name)
    if not task_id:
        raise UserError(f"result row {dict(item)!r} names no task (task_id or task_name).")
    origin = item.get("origin") or item.get("strategy") or ""
    level = item.get("level")
    known = {"task_id", "task_name", "level", "origin", "strategy", "verdict", "candidate_id", "best", "ci_low",
             "ci_high", *_VERDICT_KEYS}
    return ResultRow(
        task_id=task_id,
        task_name=task_name or task_id,
        level=int(level) if level not in (None, "") else 0,
        origin=str(origin),
        verdict=verdict,
        candidate_id=str(item.get("candidate_id") or verdict.candidate_id or ""),
        extra={k: v for k, v in item.items() if k not in known},
    )


def as_rows(items: Iterable[ResultRow | Mapping]) -> list[ResultRow]:
    return [as_row(item) for item in items]


def _cell(value: Any) -> Any:
    return "" if value is None else value


def write_results_csv(rows: Iterable[ResultRow | Mapping], path: str | Path, best: set[int] | None = None) -> Path:
    """One line per candidate. `best` holds the indices (in `rows`) of each task's best candidate."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    best = best or set()
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for index, row in enumerate(as_rows(rows)):
            ci = row.verdict.ci or [None, None]
            writer.writerow(
                {
                    "task_id": row.task_id,
                    "task_name": row.task_name,
                    "level": row.level,
                    "origin": row.origin,
                    "candidate_id": row.candidate_id,
                    "status": row.status,
                    "speedup": _cell(row.verdict.speedup),
                    "raw_speedup": _cell(row.verdict.raw_speedup),
                    "reference_ms": _cell(row.verdict.reference_ms),
                    "candidate_ms": _cell(row.verdict.candidate_ms),
                    "ci_low": _cell(ci[0] if len(ci) > 0 else None),
                    "ci_high": _cell(ci[1] if len(ci) > 1 else None),
                    "device": row.verdict.device,
                    "best": int(index in best),
                    "reasons": _REASON_SEPARATOR.join(r.replace("\n", " ") for r in row.verdict.reasons),
                }
            )
    return path


def read_results_csv(path: str | Path) -> list[ResultRow]:
    """Rows back from a results CSV written by `write_results_csv` (to compare runs made elsewhere)."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = {"task_id", "status"} - set(reader.fieldnames or ())
            if missing:
                raise UserError(
                    f"not a results CSV: missing column(s) {', '.join(sorted(missing))}.", path=str(path)
                )
            rows = []
            for line, record in enumerate(reader, start=2):
                try:
                    rows.append(as_row(record))
                except (ValueError, UserError) as exc:
                    raise UserError(f"bad result row: {exc}", path=str(path), line=line) from None
            return rows
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror}.", path=str(path)) from None
