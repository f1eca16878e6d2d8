"""Plain records the store returns (rows as data, never live cursors), and how a candidate row becomes one."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass, field
from typing import Any

from cuda_l1.evaluate.verdict import Verdict

ORIGIN_KINDS = ("strategy", "llm", "audit", "import", "manual")
FAILURE_MESSAGE_CHARS = 2000  # the store keeps a readable excerpt; prompts cut it further


@dataclass
class Origin:
    """Where a candidate came from."""

    kind: str  # one of ORIGIN_KINDS
    strategy: str = ""  # offline strategy name, e.g. "torch_compile:max-autotune"
    model: str = ""  # LLM that wrote it
    prompt_id: int | None = None  # prompts.id of the prompt that produced it
    parent_ids: list[str] = field(default_factory=list)  # exemplar candidate ids the prompt showed

    def __post_init__(self) -> None:
        if self.kind not in ORIGIN_KINDS:
            raise ValueError(f"origin kind must be one of {', '.join(ORIGIN_KINDS)}, not {self.kind!r}")

    @classmethod
    def coerce(cls, value: "Origin | dict | str") -> "Origin":
        if isinstance(value, Origin):
            return value
        if isinstance(value, str):
            return cls(kind=value)
        known = {"kind", "strategy", "model", "prompt_id", "parent_ids"}
        unknown = set(value) - known
        if unknown:
            raise ValueError(f"unknown origin field(s): {', '.join(sorted(unknown))}")
        return cls(**value)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def origin_label(origin: dict) -> str:
    """Short label for tables: the strategy name, "llm:<model>", or the origin kind."""
    kind = origin.get("kind", "")
    if kind == "strategy" and origin.get("strategy"):
        return str(origin["strategy"])
    if kind == "llm" and origin.get("model"):
        return f"llm:{origin['model']}"
    return str(kind)


@dataclass
class RunRecord:
    id: int
    name: str
    created_at: float
    config: dict
    notes: str


@dataclass
class CandidateRecord:
    """A candidate and, when it came from a verdict query, what that verdict measured."""

    candidate_id: str
    task_id: str
    code: str
    origin: dict
    norm_hash: str
    created_at: float
    speedup: float | None = None
    device: str = ""
    status: str = ""
    verdict_id: int | None = None


# The candidate columns every candidate query selects (as `c`), so `candidate_record` can read any of them.
CANDIDATE_COLUMNS = "c.id, c.task_id, c.code, c.origin, c.norm_hash, c.created_at"


def candidate_record(row: sqlite3.Row, **extra) -> CandidateRecord:
    """A row holding CANDIDATE_COLUMNS as a record; `extra` carries what a verdict query measured."""
    return CandidateRecord(
        candidate_id=row["id"],
        task_id=row["task_id"],
        code=row["code"],
        origin=row_json(row["origin"], {}),
        norm_hash=row["norm_hash"],
        created_at=row["created_at"],
        **extra,
    )


@dataclass
class FailureRecord:
    """A recent failure of a task: what a prompt shows the model so it does not repeat it."""

    status: str  # a verdict status or "parse_error"
    reasons: list[str]
    message: str  # compiler / runtime / check output, already cut to FAILURE_MESSAGE_CHARS
    candidate_id: str | None
    created_at: float


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


def failure_message(verdict: Verdict) -> str:
    """The part of a failed verdict worth showing a model: failed checks, then the candidate's log tail."""
    parts = [f"{c.name}: {c.detail}" if c.detail else c.name for c in verdict.failed_checks()]
    if not parts:
        parts = list(verdict.reasons)
    if verdict.log.strip() and verdict.status in ("compile_error", "runtime_error", "timeout"):
        parts.append(_tail(verdict.log.strip(), FAILURE_MESSAGE_CHARS // 2))
    message = "\n".join(p for p in parts if p)
    return message if len(message) <= FAILURE_MESSAGE_CHARS else message[: FAILURE_MESSAGE_CHARS - 1] + "…"


def row_json(text: str | None, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return default
