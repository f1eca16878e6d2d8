"""Evaluation throughput: candidates per minute on a mixed batch of PyTorch-level candidates over the
built-in suite, every default check on (a script, not a test). Goal on one H200: >= 60 per minute.

The batch mixes, per task: the eager strategy (correct), a candidate that returns a wrong value
(incorrect), one that mutates its input (rejected), and one whose forward raises (runtime_error).
The rate counts the pool's start; `first_verdict_s`, `after_first_per_minute` (the rate once the
first verdict is in, what a long run sees) and `worker_start_s` (the worker's own start, seconds
after the pool was asked for) say how much of it the start is.

    python benchmarks/throughput.py --out benchmarks/results/throughput-h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from envinfo import environment  # noqa: E402

from cuda_l1.evaluate.config import EvalConfig  # noqa: E402
from cuda_l1.evaluate.jobs import EvalJob  # noqa: E402
from cuda_l1.evaluate.pool import make_pool  # noqa: E402
from cuda_l1.strategies import STRATEGIES  # noqa: E402
from cuda_l1.tasks import load_builtin  # noqa: E402

WRONG = """

class ModelNew(Model):
    def forward(self, *args):
        out = super().forward(*args)
        return [o * 1.1 for o in out] if isinstance(out, (list, tuple)) else out * 1.1
"""
MUTATES = """

class ModelNew(Model):
    def forward(self, *args):
        out = super().forward(*args)
        for a in args:
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                a.mul_(0.5)
                break
        return out
"""
RAISES = """

class ModelNew(Model):
    def forward(self, *args):
        raise RuntimeError("kernel launch failed: invalid configuration")
"""


def batch(tasks) -> list[EvalJob]:
    jobs = []
    for task in tasks:
        jobs.append(EvalJob(task, STRATEGIES["eager"].generate(task), meta={"kind": "eager"}))
        for kind, tail in (("wrong", WRONG), ("mutates", MUTATES), ("raises", RAISES)):
            jobs.append(EvalJob(task, task.source + tail, meta={"kind": kind}))
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", choices=("cpu", "gpu"), default=None,
                        help="built-in suite sizes (default: gpu on a CUDA device, cpu otherwise)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    parser.add_argument("--lookahead", type=int, default=None,
                        help="jobs a worker loads ahead (default: the setting's, 2 on CUDA, 0 on CPU)")
    parser.add_argument("--spares", type=int, default=None, help="spare sides a worker keeps warming")
    parser.add_argument("--no-preload", action="store_true",
                        help="the fork server does not import torch.compile's modules (to compare)")
    parser.add_argument("--fresh-sides", action="store_true",
                        help="sides started as fresh interpreters, not forked from the fork server (the default)")
    parser.add_argument("--input-memory-gib", type=float, default=None,
                        help="budget of the input slots (EvalConfig.input_memory_bytes), GiB; default two fifths of the GPU (at most half its free memory)")
    args = parser.parse_args()
    tasks = load_builtin(args.sizes or ("gpu" if args.device.startswith("cuda") else "cpu"))[: args.limit]
    jobs = batch(tasks)
    config = EvalConfig(device=args.device)
    if args.lookahead is not None:
        config.lookahead = args.lookahead
    if args.spares is not None:
        config.spares = args.spares
    config.sandbox.fork_server = not args.fresh_sides
    config.sandbox.preload_compilers = not args.no_preload
    if args.input_memory_gib:
        config.input_memory_bytes = int(args.input_memory_gib * (1 << 30))
    statuses: Counter = Counter()
    per_kind: dict = {}
    identical: dict = {}  # the eager candidates are the reference's own code: they must measure 1.00
    started, started_wall = time.perf_counter(), time.time()
    arrivals: list[float] = []
    worker_start: dict = {}
    with make_pool("local", args.device, config, args.workers) as pool:
        for result in pool.run(jobs):
            arrivals.append(time.perf_counter() - started)
            if "worker_start" in result.verdict.timing and not worker_start:
                worker_start = {k: v if k.endswith("_s") else round(v - started_wall, 2)
                                for k, v in result.verdict.timing["worker_start"].items()}
                print(f"worker start, seconds after the pool was asked for: {json.dumps(worker_start)}", flush=True)
            statuses[result.verdict.status] += 1
            if result.job.meta["kind"] == "eager":
                identical[result.job.task.key] = {"status": result.verdict.status, "speedup": result.verdict.speedup,
                                                  "raw": result.verdict.raw_speedup, "ci": result.verdict.ci}
            per_kind.setdefault(result.job.meta["kind"], Counter())[result.verdict.status] += 1
            # The arrival time next to each verdict's own elapsed time shows what no verdict is charged
            # with: a task's preparation (its reference's side) and the pool's gaps between jobs.
            print(f"t={time.perf_counter() - started:7.1f}s {result.job.task.key:40s} {result.job.meta['kind']:8s} "
                  f"{result.verdict.status:14s} {result.verdict.elapsed_s:6.1f}s "
                  f"{json.dumps(result.verdict.timing.get('phases_s') or {})}",
                  flush=True)
    seconds = time.perf_counter() - started
    rate = len(jobs) / seconds * 60
    # The rate once the first verdict is in: what a long run (an RL stage) sees after its one start.
    warm_rate = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]) * 60 if len(arrivals) > 1 else None
    out = {"environment": environment(), "workers": args.workers, "candidates": len(jobs), "tasks": len(tasks),
           "seconds": seconds, "candidates_per_minute": rate, "goal_per_minute": 60, "meets_goal": rate >= 60,
           "first_verdict_s": arrivals[0] if arrivals else None, "after_first_per_minute": warm_rate,
           "worker_start_s": worker_start,
           "statuses": dict(statuses), "statuses_by_kind": {k: dict(v) for k, v in per_kind.items()},
           "identical": identical,
           "identical_raw_within_2pct": sum(1 for v in identical.values() if v["raw"] and abs(v["raw"] - 1) <= 0.02),
           "identical_scored_1": sum(1 for v in identical.values() if v["speedup"] is not None
                                     and round(v["speedup"], 2) == 1.0),
           "config": {"timing": vars(config.timing), "correctness_trials": config.correctness_trials,
                      "lookahead": config.lookahead, "spares": config.spares,
                      "fork_server": config.sandbox.fork_server,
                      "preload_compilers": config.sandbox.preload_compilers}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps({k: v for k, v in out.items() if k != "environment"}, default=str))


if __name__ == "__main__":
    main()
