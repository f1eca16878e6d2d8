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
A file named `*.gz` is read as gzip (`gzip -k verdicts.jsonl` makes one to keep).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
import zlib
from pathlib import Path

from cuda_l1.errors import UserError
from cuda_l1.evaluate.verdict import ALL_STATUSES, CORRECTNESS_ONLY, OK, Check, Verdict
from cuda_l1.store.set_aside import set_aside
from cuda_l1.text import has_surrogate

VERDICTS_NAME = "verdicts.jsonl"
IMPORTED_CHECK = "imported"
_FIELDS = ("task_id", "candidate_id", "device", "config_key", "verdict")

Key = tuple[str, str, str, str]  # (task_id, candidate_id, device key, settings key)


def write_verdicts(store, path: str | Path, carried: dict[Key, Verdict] | None = None) -> int:
    """Every verdict in `store`, one JSON object a line, written atomically, then those the store does
    not hold of `carried` (verdicts read from another file) and of the file already at `path`: a run
    that took verdicts for some of its programs, or for none (another --limit, other levels), still
    writes every verdict it was given, so keeping only its file loses nothing. Returns the count."""
    path = Path(path)
    rows = store.all_verdicts()
    held = {tuple(row[name] for name in _FIELDS[:4]) for row in rows}
    try:
        before = read_verdicts(path, mark=False) if path.is_file() else {}
    except UserError:  # kept, not lost, and not in the way of the report this run has earned
        set_aside(path)
        before = {}
    rows = [row for row in rows if row["verdict"]]  # a stored verdict that cannot be parsed is not written
    for key, verdict in [*(carried or {}).items(), *before.items()]:
        if key not in held:
            held.add(key)
            rows.append({"task_id": key[0], "candidate_id": key[1], "device": key[2], "config_key": key[3],
                         "verdict": verdict.to_dict()})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({name: row[name] for name in _FIELDS}, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)  # a file to keep and share (mkstemp made it 0600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(rows)


def read_verdicts(path: str | Path, mark: bool = True) -> dict[Key, Verdict]:
    """The verdicts of a file written by `write_verdicts`, keyed by (task, candidate, device, settings).
    A malformed file is bad input (UserError naming the line), never a half-read set: every field a
    report or the store reads is checked for its type here, before any work. With `mark`, each verdict
    is marked with an `imported` check naming the file."""
    path = Path(path)
    try:  # a .gz file is read as gzip: a thousand verdicts are ~7 MB as text, a tenth of that compressed
        data = path.read_bytes()
        lines = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as exc:
        raise UserError(f"cannot read the verdicts file: {exc}", path=str(path)) from None
    out: dict[Key, Verdict] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
            key = tuple(record[name] for name in _FIELDS[:4])
            if not all(isinstance(part, str) and part for part in key[:3]) or not isinstance(key[3], str):
                raise ValueError("ids, device and settings key must be strings")
            if not isinstance(record["verdict"], dict):
                raise ValueError("verdict is not an object")
            verdict = Verdict.from_dict(record["verdict"])
            _check_verdict(verdict, key)
            # JSON's "\ud800" escape decodes to a str no store or report can write (UnicodeEncodeError);
            # strict UTF-8 text holds no surrogate, so only a line with an escape needs the check.
            if "\\u" in line and has_surrogate(json.dumps(record, ensure_ascii=False)):
                raise ValueError("a lone surrogate (a \\ud800-style escape) is not text a store can hold")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise UserError(f"line {number} is not a verdict record ({str(exc)[:200]}); the file is written by "
                            "bench, audit and report as verdicts.jsonl.", path=str(path)) from None
        if mark:
            verdict.checks = [c for c in verdict.checks if c.name != IMPORTED_CHECK]
            verdict.checks.append(Check(IMPORTED_CHECK, None, f"from {path.name}", blocking=False))
        out[key] = verdict
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_verdict(v: Verdict, key: Key) -> None:
    """Raise ValueError unless every field of `v` has the type the store and the reports expect."""
    if v.status not in ALL_STATUSES:
        raise ValueError(f"unknown status {v.status!r}")
    for name in ("task_id", "candidate_id", "device", "task_name", "log"):
        if not isinstance(getattr(v, name), str):
            raise ValueError(f"{name} is not a string")
    for name, ours in (("task_id", key[0]), ("candidate_id", key[1])):
        if getattr(v, name) and getattr(v, name) != ours:
            raise ValueError(f"the verdict names another {name} than its line")
    for name in ("speedup", "raw_speedup", "reference_ms", "candidate_ms"):
        value = getattr(v, name)
        if value is not None and not (_number(value) and value >= 0):
            raise ValueError(f"{name} is not a number")
    if v.ci is not None and not (isinstance(v.ci, list) and len(v.ci) == 2 and all(_number(x) for x in v.ci)):
        raise ValueError("ci is not two numbers")
    if not (isinstance(v.reasons, list) and all(isinstance(r, str) for r in v.reasons)):
        raise ValueError("reasons is not a list of strings")
    for c in v.checks:
        if not (isinstance(c.name, str) and c.passed in (True, False, None) and isinstance(c.detail, str)
                and isinstance(c.blocking, bool)):
            raise ValueError("a check is malformed")
    for name in ("versions", "timing", "sandbox"):
        if not isinstance(getattr(v, name), dict):
            raise ValueError(f"{name} is not an object")
    if not all(isinstance(k, str) and isinstance(x, str) for k, x in v.versions.items()):
        raise ValueError("versions are not strings")
    if not _number(v.elapsed_s) or not (isinstance(v.attempts, int) and not isinstance(v.attempts, bool)):
        raise ValueError("elapsed_s or attempts is not a number")
    if v.status == OK and v.timing.get("protocol") != CORRECTNESS_ONLY:  # a timed ok verdict says what it measured
        missing = [name for name in ("speedup", "raw_speedup", "reference_ms", "candidate_ms") if getattr(v, name) is None]
        if missing or not v.speedup > 0:
            raise ValueError(f"an ok verdict without {', '.join(missing) or 'a positive speedup'} (only one with "
                             f"timing disabled, timing.protocol {CORRECTNESS_ONLY!r}, has none)")
