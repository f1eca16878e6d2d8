"""Where a run's verdicts spent their time, by level and strategy, read from its store (no GPU needed):
counts and statuses, speedups (median, geometric mean, faster than the reference), and the medians of
each verdict's phases (`timing.phases_s`: load, windows, verification, measure_total), with how many
stopped at the time cap and how many were judged again after a crowded device (`timing.crowded_retry`).

    python benchmarks/run_phases.py runs/kb --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
from pathlib import Path

from cuda_l1.report.aggregates import geomean, median

STRATEGY = re.compile(r"offline strategy: (\S+) ----")
PHASES = ("load", "windows", "verification", "measure_total")


def latest_verdicts(store: Path) -> list[dict]:
    """The newest verdict of each (task, candidate), with its task's level and name and its strategy."""
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    rows = db.execute("SELECT t.level, t.name, c.code, v.verdict FROM verdicts v JOIN candidates c ON c.id = v.candidate_id "
                      "JOIN tasks t ON t.id = v.task_id ORDER BY v.id").fetchall()
    db.close()
    latest: dict[tuple, dict] = {}
    for level, name, code, text in rows:
        found = STRATEGY.search(code)
        verdict = json.loads(text)
        latest[(level, name, found.group(1) if found else "given")] = verdict
    return [dict(level=k[0], task=k[1], strategy=k[2], verdict=v) for k, v in latest.items()]


def _rounded(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


def summary(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["level"], row["strategy"]), []).append(row["verdict"])
    out = []
    for (level, strategy), verdicts in sorted(groups.items()):
        ok = [v["speedup"] for v in verdicts if v["status"] == "ok" and v.get("speedup")]
        timing = [v.get("timing") or {} for v in verdicts]
        statuses: dict[str, int] = {}
        for v in verdicts:
            statuses[v["status"]] = statuses.get(v["status"], 0) + 1
        out.append({
            "level": level, "strategy": strategy, "verdicts": len(verdicts), "statuses": statuses,
            "median_speedup": _rounded(median(ok)),
            "geomean_speedup": _rounded(geomean(ok)),
            "faster": sum(1 for s in ok if s > 1.0),
            "median_phases_s": {p: _rounded(median(t["phases_s"][p] for t in timing if p in t.get("phases_s", {})))
                                for p in PHASES},
            "stopped_at_time_cap": sum(1 for t in timing if t.get("stopped") == "time"),
            "crowded_retries": sum(1 for t in timing if "crowded_retry" in t),
        })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run directory (its history.sqlite)")
    parser.add_argument("--out", default="", help="also write the JSON here")
    args = parser.parse_args()
    store = Path(args.run) / "history.sqlite"
    if not store.is_file():
        raise SystemExit(f"run_phases.py: no store at {store}")
    text = json.dumps(summary(latest_verdicts(store)), indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
