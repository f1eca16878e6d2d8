"""Repeatability of the timing protocol (a script, not a test).

1. One candidate evaluated N times, each time in a fresh child process: the spread of its speedup.
2. Identical code (the reference as the candidate) on a launch-bound, a memory-bound and a
   compute-bound task: how far from 1.00 it measures.
Goal (H200): spread <= 2%, identical code 1.00 +- 0.02.

    python benchmarks/repeatability.py --out benchmarks/results/repeatability-h200.json
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

from cuda_l1.evaluate.config import EvalConfig  # noqa: E402
from cuda_l1.evaluate.evaluator import Evaluator  # noqa: E402
from cuda_l1.tasks import load_task_file  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REFS = ROOT / "tests" / "corpus" / "refs"
KINDS = {"launch-bound": "many_small_ops", "memory-bound": "big_relu_add", "compute-bound": "gpu_matmul"}


def identical(task) -> str:
    return task.source.replace("class Model(", "class ModelNew(")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--candidate", default=str(ROOT / "tests/corpus/gpu/fused_cuda_kernel.py"),
                        help="candidate for the spread measurement (its header names its reference)")
    args = parser.parse_args()
    config = EvalConfig(device=args.device)
    result = {"environment": environment(), "goal": {"spread": 0.02, "identical": 0.02}, "identical": {}}

    cand_path = Path(args.candidate)
    ref_name = next(line.split(":", 1)[1].strip() for line in cand_path.read_text().splitlines()
                    if line.startswith("# reference:"))
    task = load_task_file(REFS / f"{ref_name}.py")
    evaluator = Evaluator(task, config)
    runs = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        v = evaluator.evaluate(cand_path.read_text())
        runs.append({"status": v.status, "speedup": v.speedup, "raw_speedup": v.raw_speedup, "ci": v.ci,
                     "reference_ms": v.reference_ms, "candidate_ms": v.candidate_ms, "seconds": time.perf_counter() - t0,
                     "rounds": v.timing.get("rounds"), "throttled": v.timing.get("throttled")})
        print(cand_path.name, runs[-1], flush=True)
    evaluator.close()
    raws = [r["raw_speedup"] for r in runs if r["raw_speedup"]]
    spread = (max(raws) - min(raws)) / statistics.median(raws) if raws else None
    result["spread"] = {"candidate": cand_path.name, "task": ref_name, "runs": runs, "relative_spread": spread,
                        "meets_goal": spread is not None and spread <= 0.02}

    for kind, name in KINDS.items():
        task = load_task_file(REFS / f"{name}.py")
        evaluator = Evaluator(task, config)
        runs = []
        for _ in range(args.repeats):
            v = evaluator.evaluate(identical(task))
            runs.append({"status": v.status, "raw_speedup": v.raw_speedup, "speedup": v.speedup, "ci": v.ci,
                         "reference_ms": v.reference_ms, "candidate_ms": v.candidate_ms, "rounds": v.timing.get("rounds")})
            print(kind, runs[-1], flush=True)
        evaluator.close()
        raws = [r["raw_speedup"] for r in runs if r["raw_speedup"]]
        worst = max(abs(r - 1.0) for r in raws) if raws else None
        result["identical"][kind] = {"task": name, "runs": runs, "max_deviation_from_1": worst,
                                     "meets_goal": worst is not None and worst <= 0.02}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, default=str)[:3000])


if __name__ == "__main__":
    main()
