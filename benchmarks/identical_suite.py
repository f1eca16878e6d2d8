"""Identical-code calibration over the built-in suite (a script, not a test).

Every task's reference is evaluated as its own candidate, in fresh child processes: an honest timer
reports about 1.00 for each. Prints one line per evaluation and writes per-task results and a summary
(how many raw speedups fall within +-2% / +-5% / +-10% of 1, scores other than 1.00, time per
evaluation) with the environment.

    python benchmarks/identical_suite.py --device cpu --out benchmarks/results/identical-cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from envinfo import environment  # noqa: E402

from cuda_l1.evaluate.config import EvalConfig  # noqa: E402
from cuda_l1.evaluate.evaluator import Evaluator  # noqa: E402
from cuda_l1.tasks.loaders import load_tasks, parse_levels  # noqa: E402
from cuda_l1.tasks.sizes import for_device  # noqa: E402


def builtin_source(args) -> str:
    return f"builtin:{args.sizes}" if args.sizes else for_device("builtin", args.device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N")
    parser.add_argument("--sizes", choices=("cpu", "gpu"), default=None,
                        help="built-in suite sizes (default: gpu on a CUDA device, cpu otherwise)")
    parser.add_argument("--levels", default=None, help="only these levels, e.g. 1,2")
    parser.add_argument("--repeats", type=int, default=1, help="evaluations per task (each in a fresh child)")
    parser.add_argument("--settle-ms", type=float, default=None, help="TimingConfig.settle_s, in ms (default: its default)")
    parser.add_argument("--settle-rate", type=float, default=None,
                        help="TimingConfig.settle_rate: share of rounds read right after the window (default: its default)")
    args = parser.parse_args()

    rows = []
    started = time.time()
    for task in load_tasks(builtin_source(args), levels=parse_levels(args.levels)):
        config = EvalConfig(device=args.device)
        if args.settle_ms is not None:
            config = dataclasses.replace(config, timing=dataclasses.replace(config.timing, settle_s=args.settle_ms / 1000))
        if args.settle_rate is not None:
            config = dataclasses.replace(config, timing=dataclasses.replace(config.timing, settle_rate=args.settle_rate))
        evaluator = Evaluator(task, config)
        # The reference's own class under the candidate's name; `Model` names it too (KernelBench's classes
        # call super(Model, self).__init__(), which found no Model once renamed)
        source = task.source.replace("class Model(", "class ModelNew(") + "\n\nModel = ModelNew\n"
        try:
            for repeat in range(args.repeats):
                t0 = time.perf_counter()
                verdict = evaluator.evaluate(source)
                row = {"task": task.key, "repeat": repeat, "status": verdict.status, "raw": verdict.raw_speedup,
                       "score": verdict.speedup, "ci": verdict.ci, "reference_ms": verdict.reference_ms,
                       "candidate_ms": verdict.candidate_ms, "rounds": verdict.timing.get("rounds"),
                       "seconds": round(time.perf_counter() - t0, 2), "stopped": verdict.timing.get("stopped"),
                       "phases_s": verdict.timing.get("phases_s"), "sides": verdict.timing.get("sides")}
                print(json.dumps(row), flush=True)
                # Every round's times and order, so another estimator can be tried on the same rounds.
                row["samples"] = verdict.timing.get("samples")
                rows.append(row)
        finally:
            evaluator.close()
    timed = [r for r in rows if r["raw"] is not None]
    deviation = [abs(r["raw"] - 1.0) for r in timed]
    summary = {
        "evaluations": len(rows),
        "ok": sum(r["status"] == "ok" for r in rows),
        "raw_within": {f"{p}%": sum(d <= p / 100 for d in deviation) for p in (2, 5, 10)},
        "raw_median_abs_deviation": statistics.median(deviation) if deviation else None,
        "raw_worst": max(timed, key=lambda r: abs(r["raw"] - 1.0))["raw"] if timed else None,
        "scores_not_1": sorted(r["score"] for r in timed if r["score"] != 1.0),
        "seconds_per_evaluation": statistics.mean(r["seconds"] for r in rows) if rows else None,
        "wall_s": round(time.time() - started, 1),
    }
    print(json.dumps(summary, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"environment": environment(),
                                          "summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
