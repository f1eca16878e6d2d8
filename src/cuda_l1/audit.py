"""Re-auditing a published solution set: claimed vs measured speedup, per task and in total.

    cuda-l1 audit SOLUTIONS.jsonl --out DIR

A claim *holds* when the candidate is verified correct and its measured speedup reaches at least
`hold_fraction` of the claim; it *shrinks* when correct but slower than that; it is an *exploit* when
the evaluator refuses the candidate as a hack (status `rejected`); otherwise it *fails* (incorrect,
crashing, not compiling) or is *missing* (no candidate published). A correct candidate whose speedup
could not be measured (its timing windows were no longer than their fixed overhead) is *unmeasured*.
A record whose reference (`ref_code`) does not run here is *task_broken*: its kernel is not judged, the
others are, and the command exits 2 once the table is written.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import json
import math
from pathlib import Path
from typing import Mapping

from cuda_l1.bench import (MISSING_RULE, Candidate, RunContext, candidates_from_jsonl,
                           evaluate_candidates, keep_verdicts, write_report)
from cuda_l1.devices import Device, as_device, device_key
from cuda_l1.errors import UserError
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.verdict import OK, REJECTED, Verdict

CLAIM_FIELDS = ("score_speedup", "speedup", "score_default", "score")


def _speedup_value(value) -> float | None:
    """A number usable as a claimed speedup: finite and above 0 (a claim of -3, 0, NaN, infinity or an
    integer too large for a float is no claim: counted as "holds" or "shrinks" it would say nothing)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def claimed_speedup(claims: dict) -> float | None:
    """The headline claim of a record: the first known field, else the first numeric score field (None:
    no usable claim, the record is "unclaimed")."""
    known = [claims.get(name) for name in CLAIM_FIELDS]
    for value in known + [value for _, value in sorted(claims.items())]:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _speedup_value(value)
    return None


def decision_points(claims: dict, hold_fraction: float) -> tuple[float, ...]:
    """The one speedup the audit decides a record at: where its claim stops holding. Timing may stop
    once the interval is clear of it (TimingConfig.decide_early), instead of narrowing to 2% for a
    number the audit only compares with the claim."""
    claim = claimed_speedup(claims)
    return (hold_fraction * claim,) if claim is not None else ()


TASK_BROKEN = "task_broken"  # a record whose ref_code does not run here: its kernel is not judged


def outcome(verdict: Verdict | None, claim: float | None, hold_fraction: float) -> str:
    if verdict is None:
        return "missing"
    if verdict.status == REJECTED:
        return "exploit"
    if verdict.status != OK:
        return "fails"
    if any(c.name == "timing_resolved" and c.passed is False for c in verdict.checks):
        return "unmeasured"  # correct, but its windows were lost in their overhead (timing.resolution_note)
    if claim is None:
        return "unclaimed"
    measured = verdict.speedup if verdict.speedup is not None else 1.0
    return "holds" if measured >= hold_fraction * claim else "shrinks"


MODE_NOTES = {
    "eval": "Both models ran in eval mode (model.eval()), as CUDA-L1's harness runs them.",
    "train": "Both models ran as constructed (training mode), as KernelBench's harness runs them: a kernel "
             "that assumes eval mode (BatchNorm folded into a convolution) fails where BatchNorm is used.",
}


def run_audit(path: str, out_dir: str, *, device: Device | str | None, config: EvalConfig, cluster: str = "local",
              workers: int | None = None, hold_fraction: float = 0.9, progress: bool = True,
              levels: set[int] | None = None, rejudge: frozenset[str] = frozenset(),
              imported: Mapping | None = None) -> dict:
    """levels: only the records of these levels (None: all); rejudge: stored statuses judged again;
    imported: verdicts read from a verdicts file (read_imported), taken for the programs they match."""
    device = as_device(device, cluster)
    config = dataclasses.replace(config, device=str(device))
    candidates, missing = candidates_from_jsonl(path)
    if levels:
        present = sorted({c.task.level for c in candidates} | {m["task"].level for m in missing})
        candidates = [c for c in candidates if c.task.level in levels]
        missing = [m for m in missing if m["task"].level in levels]
        if not candidates and not missing:
            raise UserError(f"{path}: no record matched --levels {','.join(map(str, sorted(levels)))}; "
                            f"the levels here are {', '.join(map(str, present))}.")
    verdicts: dict[int, Verdict] = {}

    def keep(cand: Candidate, verdict: Verdict) -> None:
        verdicts[cand.meta["line"]] = verdict

    ctx = RunContext(out_dir, "audit", {"source": path, "device": str(device)})
    ctx.imported = dict(imported or {})
    try:
        try:
            counts = evaluate_candidates(ctx, candidates, config, device=device, cluster=cluster, workers=workers,
                                         progress=progress, on_result=keep,
                                         decides_at=lambda cand: decision_points(cand.meta["claims"], hold_fraction),
                                         rejudge=rejudge, imported=imported)
        except BaseException:  # interrupted, or a broken task: what was judged outlives the run as a file too
            keep_verdicts(ctx)
            raise
        dkey, ckey = device_key(device), config.config_key()
        broken = counts["broken_tasks"]  # task id -> its key and why its reference does not run here
        rows = []
        for cand in candidates:  # resumed candidates come back from the store
            verdict = verdicts.get(cand.meta["line"])
            if verdict is None:
                from cuda_l1.store import candidate_id

                verdict = ctx.store.verdict_for(candidate_id(cand.source), dkey, ckey, task_id=cand.task.id)
            if cand.task.id in broken:  # a broken ref_code is bad input, not a verdict (nor an older one)
                row = _row(cand.task, cand.meta["line"], cand.meta["claims"], None, hold_fraction)
                row.update(status=TASK_BROKEN, outcome=TASK_BROKEN, reasons=[broken[cand.task.id]["why"]])
            else:
                row = _row(cand.task, cand.meta["line"], cand.meta["claims"], verdict, hold_fraction)
            rows.append(row)
        rows += [_row(m["task"], m["line"], m["claims"], None, hold_fraction) for m in missing]
        rows.sort(key=lambda r: r["line"])
        paths = write_report(ctx, f"cuda-l1 audit: {Path(path).name} on {dkey}",
                             [f"A claim holds when measured >= {hold_fraction:g} x claimed and the candidate is verified.",
                              MODE_NOTES[config.module_mode]], broken)
    finally:
        ctx.close()
    totals = {k: sum(1 for r in rows if r["outcome"] == k)
              for k in ("holds", "shrinks", "unmeasured", "exploit", "fails", "missing", "unclaimed", TASK_BROKEN)}
    totals["records"] = len(rows)
    out = Path(out_dir)
    audit = {"source": str(path), "device": device_key(device), "hold_fraction": hold_fraction,
             "module_mode": config.module_mode,
             "missing_rule": MISSING_RULE, "totals": totals, "tasks": rows}
    (out / "audit.json").write_text(json.dumps(audit, indent=2, default=str))
    _write_csv(rows, out / "audit.csv")
    _append_html(out / "report.html", totals, rows)
    return {"totals": totals, "broken_tasks": broken, "paths": {**{k: str(v) for k, v in paths.items()},
                                        "audit": str(out / "audit.json"), "audit_csv": str(out / "audit.csv")}}


def _row(task, line: int, claims: dict, verdict: Verdict | None, hold_fraction: float) -> dict:
    claim = claimed_speedup(claims)
    failed = [c.name for c in verdict.failed_checks()] if verdict else []
    return {
        "line": line, "level": task.level, "task": task.number, "task_name": task.name, "task_id": task.id,
        "claimed": claim, "claims": claims,
        "measured": verdict.speedup if verdict else None,
        "raw_measured": verdict.raw_speedup if verdict else None,
        "status": verdict.status if verdict else "missing",
        "failed_checks": failed,
        "reasons": (verdict.reasons[:3] if verdict else ["no candidate in the record"]),
        "outcome": outcome(verdict, claim, hold_fraction),
    }


def _write_csv(rows: list[dict], path: Path) -> None:
    fields = ["line", "level", "task", "task_name", "claimed", "measured", "raw_measured", "status", "outcome",
              "failed_checks", "reasons"]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, "failed_checks": ";".join(r["failed_checks"]),
                             "reasons": " | ".join(str(x)[:300] for x in r["reasons"])})


def _append_html(path: Path, totals: dict, rows: list[dict]) -> None:
    def cell(v):
        return "" if v is None else html.escape(f"{v:.2f}" if isinstance(v, float) else str(v))

    table = "".join(
        f"<tr><td>{cell(r['level'])}</td><td>{cell(r['task_name'])}</td><td>{cell(r['claimed'])}</td>"
        f"<td>{cell(r['measured'])}</td><td>{cell(r['status'])}</td><td>{cell(r['outcome'])}</td>"
        f"<td>{cell(', '.join(r['failed_checks']))}</td></tr>" for r in rows)
    section = (
        "<h2>Audit: claimed vs measured</h2><p>"
        + ", ".join(f"{html.escape(k)}: {v}" for k, v in totals.items())
        + "</p><table><tr><th>level</th><th>task</th><th>claimed</th><th>measured</th><th>status</th>"
        "<th>outcome</th><th>failed checks</th></tr>" + table + "</table>"
    )
    text = path.read_text() if path.exists() else "<html><body></body></html>"
    text = text.replace("</body>", section + "</body>", 1) if "</body>" in text else text + section
    path.write_text(text)
