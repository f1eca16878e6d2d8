"""A run's verdicts as a JSONL file, without any code: what outlives the run directory.

A run directory's store holds the tasks' and candidates' sources, which are often someone else's files
(KernelBench, a published solution set) that a results repository must not carry. `verdicts.jsonl`
holds only ids (content hashes), the device, the settings key and each verdict, so it can be kept
anywhere. A later run over the same tasks, fetched again, takes the verdicts it lists
(`--verdicts-from`) instead of judging those programs again: a run of hundreds of GPU-minutes resumes
on a fresh machine from that file alone. Ids are hashes of the exact sources, so a verdict is taken
only for the same program of the same task, on the same device key, under the same settings.

Imported verdicts are trusted as written (the file is the user's own record, as the store is) and
each carries an `imported` check naming its file, so a report can tell them from fresh measurements.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from cuda_l1.errors import UserError
from cuda_l1.evaluate.verdict import ALL_STATUSES, Check, Verdict

VERDICTS_NAME = "verdicts.jsonl"
IMPORTED_CHECK = "imported"
_FIELDS = ("task_id", "candidate_id", "device", "config_key", "verdict")

Key = tuple[str, str, str, str]  # (task_id, candidate_id, device key, settings key)


def write_verdicts(store, path: str | Path) -> int:
    """Every verdict in `store`, one JSON object a line, written atomically. Returns the count."""
    rows = store.all_verdicts()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({name: row[name] for name in _FIELDS}, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(rows)


def read_verdicts(path: str | Path) -> dict[Key, Verdict]:
    """The verdicts of a file written by `write_verdicts`, keyed by (task, candidate, device, settings).
    A malformed file is bad input (UserError naming the line), never a half-read set. Each verdict is
    marked with an `imported` check naming the file."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the verdicts file: {exc}", path=str(path)) from None
    out: dict[Key, Verdict] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            key = tuple(record[name] for name in _FIELDS[:4])
            if not all(isinstance(part, str) and part for part in key[:3]) or not isinstance(key[3], str):
                raise ValueError("ids, device and settings key must be strings")
            verdict = Verdict.from_dict(record["verdict"])
            if verdict.status not in ALL_STATUSES:
                raise ValueError(f"unknown status {verdict.status!r}")
            if verdict.candidate_id and verdict.candidate_id != key[1]:
                raise ValueError("the verdict names another candidate than its line")
            for name in ("speedup", "raw_speedup", "reference_ms", "candidate_ms"):
                value = getattr(verdict, name)
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                    raise ValueError(f"{name} is not a number")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserError(f"line {number} is not a verdict record ({exc}); the file is written by "
                            "bench, audit and report as verdicts.jsonl.", path=str(path)) from None
        verdict.checks = [c for c in verdict.checks if c.name != IMPORTED_CHECK]
        verdict.checks.append(Check(IMPORTED_CHECK, None, f"from {path.name}", blocking=False))
        out[key] = verdict
    return out
