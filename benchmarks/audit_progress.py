"""Where an audit that is still under way stands: the table `cuda-l1 audit` writes at its end, made now
from the run's store, with the records not judged yet counted as `pending`.

    python benchmarks/audit_progress.py SOLUTIONS.jsonl --run runs/audit --device "NVIDIA H200" --out audit.json

An audit stopped by a time limit resumes from its store (`cuda-l1 audit ... --out DIR` again); until
it has judged every record, this is how its partial results are read and committed. Only the store is
read: nothing is evaluated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cuda_l1.audit import _row  # noqa: E402 - the audit's own row, so the outcomes match its table
from cuda_l1.bench import candidates_from_jsonl  # noqa: E402
from cuda_l1.store import Store, candidate_id  # noqa: E402

OUTCOMES = ("holds", "shrinks", "unmeasured", "exploit", "fails", "missing", "unclaimed", "pending")


def progress(solutions: str, run_dir: str, device: str, hold_fraction: float = 0.9, module_mode: str = "eval",
             quick: bool = False) -> dict:
    """The table of the audit run with these settings (`cuda-l1 audit`'s on a GPU, or with --quick):
    the verdicts of one module mode only, since a store may hold both."""
    from cuda_l1.evaluate.config import EvalConfig, TimingConfig

    timing = TimingConfig.quick() if quick else TimingConfig()
    key = EvalConfig(device="cuda", timing=timing, module_mode=module_mode).config_key()
    candidates, missing = candidates_from_jsonl(solutions)
    store = Store(Path(run_dir) / "history.sqlite", readonly=True)
    rows = []
    try:
        for cand in candidates:
            verdict = store.verdict_for(candidate_id(cand.source), device, key, task_id=cand.task.id)
            row = _row(cand.task, cand.meta["line"], cand.meta["claims"], verdict, hold_fraction)
            if verdict is None:
                row.update(status="pending", outcome="pending", reasons=["not judged yet"])
            rows.append(row)
    finally:
        store.close()
    rows += [_row(m["task"], m["line"], m["claims"], None, hold_fraction) for m in missing]
    rows.sort(key=lambda r: r["line"])
    totals = {k: sum(r["outcome"] == k for r in rows) for k in OUTCOMES}
    totals["records"] = len(rows)
    judged_ok = [r for r in rows if r["outcome"] in ("holds", "shrinks", "unclaimed")]
    claimed = [r["claimed"] for r in judged_ok if r["claimed"] is not None]
    measured = [r["measured"] for r in judged_ok if r["measured"] is not None]
    summary = {
        "correct_judged": len(judged_ok),
        "claimed_mean": statistics.mean(claimed) if claimed else None,
        "claimed_median": statistics.median(claimed) if claimed else None,
        "measured_mean": statistics.mean(measured) if measured else None,
        "measured_median": statistics.median(measured) if measured else None,
    }
    exploits = [{"task": f"L{r['level']}/{r['task']}", "reason": (r["reasons"] or [""])[0]}
                for r in rows if r["outcome"] == "exploit"]
    return {"source": solutions, "device": device, "hold_fraction": hold_fraction, "module_mode": module_mode,
            "totals": totals,
            "correct_records": summary, "exploits": exploits, "tasks": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("solutions", help="the solution set the audit runs over (.jsonl)")
    parser.add_argument("--run", default="runs/audit", help="the audit's run directory (its history.sqlite)")
    parser.add_argument("--device", required=True, help="the device key its verdicts were stored under (the GPU's name)")
    parser.add_argument("--hold", type=float, default=0.9, help="a claim holds when measured >= HOLD x claimed")
    parser.add_argument("--module-mode", default="eval", choices=("train", "eval"),
                        help="the audit's --module-mode (eval is its default; runs before it existed: train)")
    parser.add_argument("--quick", action="store_true", help="the audit ran with --quick")
    parser.add_argument("--out", help="write the JSON here (default: standard output)")
    args = parser.parse_args(argv)
    if not (Path(args.run) / "history.sqlite").is_file():
        print(f"error: no history.sqlite in {args.run}", file=sys.stderr)
        return 2
    result = progress(args.solutions, args.run, args.device, args.hold, args.module_mode, args.quick)
    text = json.dumps(result, indent=2, default=str)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    print(json.dumps(result["totals"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
