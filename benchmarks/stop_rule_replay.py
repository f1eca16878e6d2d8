"""Replay the timing stop rule on recorded rounds: what a wider `target_width` would have cost in
precision and saved in time (a script, not a test).

    python benchmarks/stop_rule_replay.py RESULTS.json [...] [--widths 0.02,0.03,0.04] [--max-time 10] [--out OUT.json]
    python benchmarks/stop_rule_replay.py RESULTS.json [...] --widths 0.02 --trims 0.5,0.2,0.1

Each RESULTS.json is an `identical_suite.py` output with per-round samples (identical code: every
task's reference judged as its own candidate). For each evaluation and each width the rounds are
replayed through the referee's own rule (timing.estimate every 4 recorded rounds from `min_rounds`,
timing.stop_reason with the default round cap and `--max-time`, the recorded phase's cap, each round
costing the evaluation's average), on the rounds that evaluation recorded: a width or cap it never
reached stops where it stopped. The seconds it would have taken are its measured
seconds less the recorded rounds not needed, each costing the evaluation's measured time per round
(`phases_s.measure_total` over recorded and warm-up rounds). Printed per width: evaluations, how many
stop before the recorded end, seconds per evaluation, raw speedups within 2% of 1, worst raw, scores
other than 1.00. `--trims`: the estimator, per replay (speedup_stats.speedup_ci's `trim`: 0.5 the
medians verdicts use, 0.2 means of the middle 60% of each side's times).
"""

from __future__ import annotations

import argparse
import json
import statistics

from cuda_l1.evaluate import timing
from cuda_l1.evaluate.config import TimingConfig


def replay(row: dict, width: float, tc: TimingConfig, spread: float, max_time_s: float, trim: float = 0.5) -> dict:
    """Where the stop rule with `width` and `max_time_s` ends on this evaluation's recorded rounds."""
    samples = row["samples"]
    ref, cand, first = samples["reference_ms"], samples["candidate_ms"], samples.get("candidate_first")
    recorded = len(ref)
    seed = 12345
    stop_at, est, reason = recorded, None, row.get("stopped", "")
    phases = row.get("phases_s", {})
    per_round = phases.get("measure_total", 0.0) / max(recorded + tc.warmup_rounds, 1)
    for n in range(tc.min_rounds, recorded + 1):
        if n % 4 and n != recorded:
            continue
        est = timing.estimate(ref[:n], cand[:n], seed, first[:n] if first else None, spread, trim)
        why = timing.stop_reason(n, est, n * per_round, min_rounds=tc.min_rounds, max_rounds=tc.max_rounds,
                                 max_time_s=max_time_s, target_width=width)
        if why:
            stop_at, reason = n, why
            break
    if est is None:
        est = timing.estimate(ref, cand, seed, first, spread, trim)
    seconds = row["seconds"] - per_round * (recorded - stop_at)
    return {"task": row["task"], "rounds": stop_at, "recorded": recorded, "why": reason, "seconds": seconds,
            "raw": est.point, "score": est.score, "width": est.relative_width}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="identical_suite.py outputs with per-round samples")
    parser.add_argument("--widths", default="0.02,0.025,0.03,0.04", help="target widths to replay, comma-separated")
    parser.add_argument("--spread", type=float, default=timing.PROCESS_SPREAD["cuda"],
                        help="process spread the score is widened by (default: the GPU's)")
    parser.add_argument("--max-time", type=float, default=TimingConfig().max_time_s,
                        help="cap on the recorded phase, seconds (each round costing the evaluation's own average)")
    parser.add_argument("--trims", default="0.5", help="estimators to replay (speedup_ci's trim), comma-separated")
    parser.add_argument("--out", help="JSON file for every replayed evaluation")
    args = parser.parse_args()
    tc = TimingConfig()
    widths = [float(w) for w in args.widths.split(",")]
    trims = [float(t) for t in args.trims.split(",")]
    report = {"command": "python benchmarks/stop_rule_replay.py " + " ".join(args.results),
              "max_time_s": args.max_time, "widths": {}}
    recorded = []
    for path in args.results:
        with open(path) as f:
            recorded += [r for r in json.load(f)["rows"] if r.get("status") == "ok" and r.get("samples")]
    for trim in trims:
        for width in widths:
            rows = [replay(r, width, tc, args.spread, args.max_time, trim) for r in recorded]
            summary = {
                "evaluations": len(rows),
                "stopped_sooner": sum(r["rounds"] < r["recorded"] for r in rows),
                "rounds_per_evaluation": statistics.mean(r["rounds"] for r in rows),
                "seconds_per_evaluation": statistics.mean(r["seconds"] for r in rows),
                "seconds_max": max(r["seconds"] for r in rows),
                "raw_within_2pct": sum(abs(r["raw"] - 1) <= 0.02 for r in rows),
                "raw_worst": min((r["raw"] for r in rows), key=lambda x: -abs(x - 1)),
                "scores_not_1": [(r["task"], round(r["score"], 3)) for r in rows if round(r["score"], 2) != 1.0],
            }
            key = str(width) if len(trims) == 1 and trim == 0.5 else f"trim {trim:g}, width {width:g}"
            report["widths"][key] = {"summary": summary, "rows": rows}
            print(f"{key}: {summary['evaluations']} evaluations, {summary['stopped_sooner']} stop sooner, "
                  f"{summary['rounds_per_evaluation']:.0f} rounds and {summary['seconds_per_evaluation']:.2f} s each "
                  f"(max {summary['seconds_max']:.1f}), raw within 2%: {summary['raw_within_2pct']}, worst raw "
                  f"{summary['raw_worst']:.3f}, scores not 1.00: {summary['scores_not_1']}")
            slow = sorted(rows, key=lambda r: -r["seconds"])[:6]
            print("   slowest: " + ", ".join(f"{r['task'].split('_')[0]} {r['seconds']:.1f}s/{r['rounds']}r "
                                             f"raw {r['raw']:.3f}" for r in slow))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
