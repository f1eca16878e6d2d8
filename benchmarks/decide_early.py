"""How much sooner a verdict comes when the caller says what it decides at (a script, not a test).

    python benchmarks/decide_early.py [--device cpu] [--repeats 3] [--size 256] --out OUT.json

One matmul task; two candidates (one twice as slow, one identical), each evaluated with the full timing
protocol `--repeats` times without thresholds and with the optimizer's (the sampler's bucket edges
and 1.0). Prints and writes rounds, why timing stopped, seconds, score and raw speedup per evaluation.
"""

from __future__ import annotations

import argparse
import json
import time

from cuda_l1.contrastive import SamplerConfig
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.tasks import Task

REFERENCE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)]


def get_init_inputs():
    return []
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--repeats", type=int, default=3, help="evaluations per candidate and setting")
    parser.add_argument("--size", type=int, default=256, help="matrix size of the task")
    parser.add_argument("--out", required=True, help="where the JSON rows go")
    args = parser.parse_args()
    reference = REFERENCE.replace("SIZE", str(args.size))
    candidates = {
        "twice as slow": reference.replace("class Model(", "class ModelNew(").replace(
            "return torch.matmul(a, b)", "torch.matmul(a, b)\n        return torch.matmul(a, b)"),
        "identical": reference.replace("class Model(", "class ModelNew("),
    }
    thresholds = tuple(sorted(set(SamplerConfig().bucket_edges) | {1.0}))
    evaluator = Evaluator(Task(name="1_Matmul", level=1, source=reference),
                          EvalConfig(device=args.device, timing=TimingConfig()))
    rows = []
    try:
        for name, source in candidates.items():
            for given in ((), thresholds):
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    verdict = evaluator.evaluate(source, remeasure=False, thresholds=given)
                    rows.append({"candidate": name, "thresholds": list(given), "status": verdict.status,
                                 "rounds": verdict.timing.get("rounds"), "stopped": verdict.timing.get("stopped"),
                                 "seconds": round(time.perf_counter() - started, 2), "speedup": verdict.speedup,
                                 "raw_speedup": verdict.raw_speedup})
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        evaluator.close()
    with open(args.out, "w") as handle:
        json.dump({"device": args.device, "size": args.size, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
