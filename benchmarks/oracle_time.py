"""What the float64 oracle costs a run, read from its verdicts (a verdicts.jsonl, or .gz, as bench, audit and
report write them; no GPU needed): per device, the seconds of the oracle's rounds against the timed part of
each verdict (`timing.phases_s`: oracle_rounds, measure_total), and the verdicts whose oracle rounds took
longer than --slow-s a round (on a GPU, an oracle that fell back to the CPU).

    python benchmarks/oracle_time.py runs/kb/verdicts.jsonl --out OUT.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

ROUNDS = re.compile(r"float64 in (\d+) of (\d+) rounds")


def read_verdicts(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return [json.loads(line)["verdict"] for line in fh if line.strip()]


def oracle_count(verdict: dict) -> int | None:
    """Rounds with a float64 comparison, as the correctness check says (None where it does not)."""
    for check in verdict.get("checks", []):
        found = ROUNDS.search(check.get("detail", ""))
        if found:
            return int(found.group(1))
    return None


def summarize(verdicts: list[dict], slow_s: float) -> dict:
    by_device: dict[str, dict] = defaultdict(lambda: {"verdicts": 0, "oracle_s": 0.0, "measure_s": 0.0, "slow": []})
    for v in verdicts:
        phases = (v.get("timing") or {}).get("phases_s") or {}
        entry = by_device[v.get("device", "?")]
        entry["verdicts"] += 1
        entry["oracle_s"] += phases.get("oracle_rounds", 0.0)
        entry["measure_s"] += phases.get("measure_total", 0.0)
        count = oracle_count(v)
        if count and phases.get("oracle_rounds", 0.0) / count > slow_s:
            entry["slow"].append({"task": v.get("task_name"), "oracle_s": round(phases["oracle_rounds"], 2),
                                  "rounds": count, "measure_s": round(phases.get("measure_total", 0.0), 2),
                                  "elapsed_s": round(v.get("elapsed_s", 0.0), 1)})
    for entry in by_device.values():
        entry["oracle_share"] = round(entry["oracle_s"] / entry["measure_s"], 3) if entry["measure_s"] else None
        entry["slow_oracle_s"] = round(sum(s["oracle_s"] for s in entry["slow"]), 1)
        entry["oracle_s"], entry["measure_s"] = round(entry["oracle_s"], 1), round(entry["measure_s"], 1)
    return dict(by_device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("verdicts", type=Path)
    parser.add_argument("--slow-s", type=float, default=2.0, help="seconds an oracle round takes to count as slow")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    summary = summarize(read_verdicts(args.verdicts), args.slow_s)
    for device, entry in summary.items():
        print(f"{device}: {entry['verdicts']} verdicts, oracle {entry['oracle_s']} s of {entry['measure_s']} s timed "
              f"({entry['oracle_share']}); {len(entry['slow'])} with slow oracle rounds, {entry['slow_oracle_s']} s")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
