"""Cost of the speedup's bootstrap interval at 400 paired rounds, against another version of speedup_stats.py (stats.py before its rename)
(a script, not a test).

    git show REV:src/cuda_l1/evaluate/speedup_stats.py > /tmp/stats_other.py
    python benchmarks/bootstrap_cost.py /tmp/stats_other.py
"""

from __future__ import annotations

import importlib.util
import json
import random
import statistics
import sys
import time

import torch

from cuda_l1.evaluate import speedup_stats as current


def _load(path: str):
    spec = importlib.util.spec_from_file_location("stats_other", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["stats_other"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    torch.set_num_threads(1)  # as in a CPU evaluation
    rng = random.Random(0)
    ref = [1 + rng.random() * 0.1 for _ in range(400)]
    cand = [0.5 + rng.random() * 0.05 for _ in range(400)]
    out = {}
    for name, module in (("other", _load(sys.argv[1])), ("current", current)):
        module.speedup_ci(ref, cand, seed=1)  # warm-up
        times = []
        for seed in range(5):
            t0 = time.perf_counter()
            interval = module.speedup_ci(ref, cand, seed=seed)
            times.append(time.perf_counter() - t0)
        out[name] = {"median_s": round(statistics.median(times), 4), "interval_last": [round(x, 4) for x in interval]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
