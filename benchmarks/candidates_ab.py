"""Two or more candidates of one task, alternated in one evaluator, round after round (a script, not a
test): does one read systematically faster than the other, or is the spread the host's noise?

    python benchmarks/candidates_ab.py tests/corpus/refs/tiny_relu.py tests/corpus/cpu/lean_harness.py \
        --identical --rounds 8 --out ab.json

--identical adds the reference's own code as a candidate (renamed ModelNew), the honest control. Each
round evaluates every candidate once, in an order that rotates from round to round. The evaluator's
settings are the CPU corpus test's (quick timing, 2 s at most a candidate).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from envinfo import environment  # noqa: E402

from cuda_l1.evaluate.config import EvalConfig, SandboxConfig, TimingConfig  # noqa: E402
from cuda_l1.evaluate.evaluator import Evaluator  # noqa: E402
from cuda_l1.tasks import make_task  # noqa: E402


def as_candidate(reference: str) -> str:
    """The reference's own code as a candidate: identical work, the honest control."""
    return reference.replace("class Model(", "class ModelNew(")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", type=Path)
    parser.add_argument("candidates", type=Path, nargs="*")
    parser.add_argument("--identical", action="store_true", help="Add the reference's own code as a candidate.")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-time", type=float, default=2.0, help="Timing cap of one evaluation, seconds.")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    reference = args.reference.read_text()
    named = {path.stem: path.read_text() for path in args.candidates}
    if args.identical:
        named["identical"] = as_candidate(reference)
    if not named:
        parser.error("no candidate: give files or --identical")
    timing = TimingConfig.quick()
    timing.max_time_s = args.max_time
    config = EvalConfig(device=args.device, timing=timing, call_timeout_s=15.0, first_call_timeout_s=30.0,
                        sandbox=SandboxConfig(memory_bytes=3 * 2**30, max_processes=24))
    evaluator = Evaluator(make_task(reference, name=args.reference.stem, level=1, origin="ab"), config)
    results: dict[str, list[dict]] = {name: [] for name in named}
    names = list(named)
    try:
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                started = time.monotonic()
                v = evaluator.evaluate(named[name], remeasure=False)
                results[name].append({"status": v.status, "speedup": v.speedup, "raw": v.raw_speedup,
                                      "ci": v.ci, "s": round(time.monotonic() - started, 2),
                                      "reference_ms": v.reference_ms})
                print(f"round {r + 1} {name}: {v.status} raw {v.raw_speedup} scored {v.speedup}", flush=True)
    finally:
        evaluator.close()
    summary = {}
    for name, rows in results.items():
        raws = [row["raw"] for row in rows if row["raw"] is not None]
        scores = [row["speedup"] for row in rows if row["speedup"] is not None]
        summary[name] = {"n": len(rows), "statuses": sorted({row["status"] for row in rows}),
                         "raw_median": statistics.median(raws) if raws else None,
                         "raw_mean": statistics.fmean(raws) if raws else None,
                         "raw_range": [min(raws), max(raws)] if raws else None,
                         "scored_above_1": sum(s > 1.0 for s in scores)}
        print(name, json.dumps(summary[name]))
    args.out.write_text(json.dumps({"environment": environment(), "command": " ".join(sys.argv),
                                    "summary": summary, "rounds": results}, indent=1))


if __name__ == "__main__":
    main()
