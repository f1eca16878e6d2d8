"""The verdict contract: what the evaluator says about one candidate, as data.

`cuda-l1 eval REF CAND --json` prints `Verdict.to_dict()`; the store keeps it; rewards read it.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Statuses, from best to worst. `parse_error` is never produced by the evaluator: the optimizer records
# it when a completion holds no usable module, so it can live in the same tables.
OK = "ok"
INCORRECT = "incorrect"
REJECTED = "rejected"
COMPILE_ERROR = "compile_error"
RUNTIME_ERROR = "runtime_error"
TIMEOUT = "timeout"
PARSE_ERROR = "parse_error"
STATUSES = (OK, INCORRECT, REJECTED, COMPILE_ERROR, RUNTIME_ERROR, TIMEOUT)
ALL_STATUSES = STATUSES + (PARSE_ERROR,)
# timing.protocol of an ok verdict with timing disabled: correct, and no speedup (every other ok verdict has one)
CORRECTNESS_ONLY = "correctness only (timing disabled)"

# Checks whose failure is the evaluation's own, not a finding about the candidate: the evaluator or its
# pool failed, the reference failed beside the candidate, the GPU was unhealthy after it.
EVALUATION_CHECKS = ("evaluator", "reference_ran", "gpu_health_after")
REJUDGE_CHECK = "rejudge"  # a stored verdict reopened by the user (Store.reopen_verdict): judged again


# Control characters, and lone surrogates (JSON's "\ud800" decodes to one; no UTF-8 encoder takes it).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Text a candidate could have written, safe to print and to write as UTF-8: control characters
    (terminal escape sequences among them) and lone surrogates become '?'; newlines and tabs stay."""
    return _CONTROL.sub("?", text)


@dataclass
class Check:
    """One named check and its outcome.

    passed: True / False, or None when the check did not run (e.g. an earlier failure) or does not apply.
    blocking: False for signals that are reported but do not decide the verdict (the static scan).
    """

    name: str
    passed: bool | None
    detail: str = ""
    blocking: bool = True

    @classmethod
    def from_dict(cls, data: dict) -> "Check":
        if not isinstance(data, dict) or "name" not in data or "passed" not in data:
            raise ValueError("a check is an object with at least a name and passed")  # (not Python's words for it)
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass
class Verdict:
    """The evaluator's verdict on one candidate for one task (see DESIGN.md, "Verdict contract")."""

    status: str
    speedup: float | None = None  # reference time / candidate time, rounded toward 1; None unless ok
    reference_ms: float | None = None  # median time of one reference call
    candidate_ms: float | None = None  # median time of one candidate call
    ci: list[float] | None = None  # 95% confidence interval of the speedup [low, high]
    checks: list[Check] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # plain words: why it is not ok
    device: str = ""  # e.g. "NVIDIA H200" or "cpu"
    versions: dict[str, str] = field(default_factory=dict)  # python, torch, cuda, driver, triton, cuda_l1
    task_id: str = ""
    task_name: str = ""
    candidate_id: str = ""  # id of the candidate's exact source (tasks.code_id)
    raw_speedup: float | None = None  # the measured ratio before conservative rounding
    timing: dict[str, Any] = field(default_factory=dict)  # per-side statistics, protocol, GPU telemetry
    sandbox: dict[str, Any] = field(default_factory=dict)  # which isolation layers were enforced
    log: str = ""  # tail of what the candidate printed (a log, never a result)
    elapsed_s: float = 0.0  # wall time of the whole evaluation
    attempts: int = 1  # evaluations it stands for: a stored unsettled verdict is replaced by the next one, counting

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def settled(self) -> bool:
        """Whether this verdict is a finding about the program, so it stands for the program's twins
        and for a resumed run. A failure of the evaluation itself (EVALUATION_CHECKS) is not: the
        program is judged again next time instead of carrying a failure it may not have caused."""
        if any(c.name == REJUDGE_CHECK and c.passed is False for c in self.checks):
            return False  # reopened on request (`--rejudge`): whatever it found, it is judged again
        return self.ok or not any(c.name in EVALUATION_CHECKS and c.passed is False for c in self.checks)

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False and c.blocking]

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        if not isinstance(data, dict) or "status" not in data:
            raise ValueError("a verdict is an object with at least a status")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["checks"] = [Check.from_dict(c) for c in data.get("checks", [])]
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> "Verdict":
        """A stored verdict; DamagedVerdict when the text is not one (a store edited or cut short)."""
        try:
            return cls.from_dict(json.loads(text))
        except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
            raise DamagedVerdict(f"a stored verdict could not be read ({type(exc).__name__}: {exc})") from None


class DamagedVerdict(sqlite3.DatabaseError):
    """A verdict in a history store that is not one: the store's contents are damaged (a DatabaseError,
    which the command line reports as such)."""
