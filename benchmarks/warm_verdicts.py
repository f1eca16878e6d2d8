"""Verdict time with a warm engine: several correct PyTorch-level candidates per task (the reference's
own code, each a distinct program), as an optimizer or RL sends them, through the local pool.

Reports the time between verdicts (what the caller waits per candidate once the engine is running)
and each verdict's own elapsed time, which with lookahead counts from its load beside earlier
candidates' windows. A script, not a test:

    python benchmarks/warm_verdicts.py .data/KernelBench --levels 1 --tasks 3 --per-task 4 --out OUT.json
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
from cuda_l1.evaluate.jobs import EvalJob  # noqa: E402
from cuda_l1.evaluate.pool import make_pool  # noqa: E402
from cuda_l1.strategies import STRATEGIES  # noqa: E402
from cuda_l1.tasks.loaders import load_tasks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="a task source: builtin, a KernelBench directory, a file")
    parser.add_argument("--levels", default="1")
    parser.add_argument("--tasks", type=int, default=3, help="the first N tasks of those levels")
    parser.add_argument("--per-task", type=int, default=4, help="candidates per task")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--lookahead", type=int, default=None)
    parser.add_argument("--fresh-sides", action="store_true",
                        help="sides started as fresh interpreters, not forked from the fork server (the default)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    levels = {int(x) for x in args.levels.split(",")}
    tasks = load_tasks(args.source, levels)[: args.tasks]
    jobs = []
    for task in tasks:
        base = STRATEGIES["eager"].generate(task)
        for k in range(args.per_task):  # a comment makes each a distinct program: none is reused
            jobs.append(EvalJob(task, base + f"\n# candidate {k}\n", meta={"k": k}))
    config = EvalConfig(device=args.device)
    if args.lookahead is not None:
        config.lookahead = args.lookahead
    config.sandbox.fork_server = not args.fresh_sides
    rows, started = [], time.perf_counter()
    last = None
    with make_pool("local", args.device, config, 1) as pool:
        for result in pool.run(jobs):
            now = time.perf_counter() - started
            v = result.verdict
            rows.append({"task": result.job.task.key, "k": result.job.meta["k"], "status": v.status,
                         "raw": v.raw_speedup, "speedup": v.speedup, "elapsed_s": v.elapsed_s, "at_s": now,
                         "since_last_s": None if last is None else now - last})
            last = now
            print(f"t={now:6.1f}s {result.job.task.key:45s} #{result.job.meta['k']} {v.status:13s} "
                  f"raw={v.raw_speedup} elapsed={v.elapsed_s:.1f}s", flush=True)
    # Within a task after its first candidate: the warm engine's time per verdict.
    warm = [r["since_last_s"] for r in rows if r["k"] > 0 and r["since_last_s"] is not None]
    out = {"environment": environment(), "source": args.source, "tasks": [t.key for t in tasks],
           "per_task": args.per_task, "lookahead": config.lookahead, "fork_server": config.sandbox.fork_server, "rows": rows,
           "warm_median_s": statistics.median(warm) if warm else None,
           "warm_max_s": max(warm) if warm else None, "total_s": time.perf_counter() - started}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps({k: v for k, v in out.items() if k not in ("environment", "rows")}, default=str))


if __name__ == "__main__":
    main()
