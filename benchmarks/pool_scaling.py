"""Evaluation throughput of the pools: candidates judged per minute with 1 worker and with every GPU.

The jobs are the built-in suite times a few offline strategies (eager, torch.compile, and on CUDA a
captured CUDA graph), judged with the real evaluator: one trusted worker per GPU, one sandboxed child
per candidate. The same jobs run with 1 worker and with N, for the local backend and, when Ray is
importable, the Ray backend. The result (command line, GPUs, driver, versions, date, and per run:
workers, candidates, seconds, candidates/minute, statuses) is written to --out as JSON, and rewritten
after every run so that a run cut short still leaves what it measured. The 1-worker run dominates the
wall time (torch.compile candidates take tens of seconds each): bound it with --tasks.

    python benchmarks/pool_scaling.py --out benchmarks/results/pool_scaling_h200x8.json
    python benchmarks/pool_scaling.py --tasks 12 --strategies eager,compile --out scaling.json
    python benchmarks/pool_scaling.py --device cpu --tasks 2 --strategies eager --workers 1,2 \
        --backends local --out /tmp/scaling_cpu.json             # a CPU smoke run (minutes)
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import platform
import shlex
import socket
import sys
import time
from pathlib import Path

import torch

from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.jobs import EvalJob
from cuda_l1.evaluate.local_pool import visible_gpus
from cuda_l1.evaluate.pool import make_pool
from cuda_l1.strategies import STRATEGIES
from cuda_l1.tasks import load_builtin

DEFAULT_STRATEGIES = "eager,compile,cudagraph"  # those that do not apply on the device are left out


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def environment(device: str) -> dict:
    """What the numbers depend on: host, GPUs, driver and library versions, date, exact command."""
    from cuda_l1.evaluate.device import driver_version, versions

    gpus = [torch.cuda.get_device_name(i) for i in range(visible_gpus())] if device == "cuda" else []
    info = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "device": device,
        "gpus": gpus,
        "driver": driver_version() if gpus else None,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "versions": dict(versions("cuda:0" if gpus else "cpu")),
    }
    if ray_available():
        import ray

        info["versions"]["ray"] = ray.__version__
    return info


def build_jobs(device: str, strategy_names: list[str], task_limit: int | None) -> tuple[list[EvalJob], list[str]]:
    """Built-in tasks x strategies that apply on `device`; returns the jobs and the strategies used."""
    tasks = load_builtin()
    if task_limit:
        # Spread a short selection over the levels instead of taking only level-1 tasks.
        by_level: dict[int, list] = collections.defaultdict(list)
        for task in tasks:
            by_level[task.level].append(task)
        rounds = zip(*[by_level[level] for level in sorted(by_level)])
        tasks = [t for group in rounds for t in group][:task_limit]
    used = [name for name in strategy_names if STRATEGIES[name].applies(device)[0]]
    jobs = [EvalJob(task, STRATEGIES[name].generate(task), key=f"{task.key}:{name}",
                    meta={"task": task.key, "strategy": name})
            for task in tasks for name in used]
    return jobs, used


def eval_config(device: str, timing: str) -> EvalConfig:
    timing_config = TimingConfig.quick() if timing == "quick" else TimingConfig()
    timing_config.enabled = timing != "off"
    return EvalConfig(device=device, timing=timing_config)


def measure(backend: str, device: str, workers: int | None, jobs: list[EvalJob], config: EvalConfig) -> dict:
    """Judge every job on a fresh pool; time from the first submission to the last verdict."""
    started = time.monotonic()
    pool = make_pool(backend, device=device, config=config, workers=workers)
    try:
        startup_s = time.monotonic() - started
        t0 = time.monotonic()
        statuses: collections.Counter = collections.Counter()
        retried, failures = 0, []
        for result in pool.run(jobs):
            statuses[result.verdict.status] += 1
            retried += result.attempts > 1
            if not result.verdict.ok and len(failures) < 20:  # enough to tell a broken setup from a slow one
                reason = result.verdict.reasons[0] if result.verdict.reasons else ""
                failures.append({"key": result.job.key, "status": result.verdict.status, "reason": reason[:300]})
        seconds = time.monotonic() - t0
        labels = list(pool.workers)
    finally:
        pool.close()
    return {
        "backend": backend,
        "workers": len(labels),
        "worker_labels": labels,
        "candidates": len(jobs),
        "startup_s": round(startup_s, 3),
        "seconds": round(seconds, 3),
        "candidates_per_minute": round(60.0 * len(jobs) / seconds, 3) if seconds > 0 else None,
        "statuses": dict(statuses),
        "retried": retried,
        "failures": failures,
    }


def speedups(runs: list[dict]) -> dict:
    """Per backend: throughput with the most workers over throughput with one."""
    out = {}
    for backend in sorted({r["backend"] for r in runs}):
        mine = [r for r in runs if r["backend"] == backend and r["candidates_per_minute"]]
        one = next((r for r in mine if r["workers"] == 1), None)
        most = max(mine, key=lambda r: r["workers"], default=None)
        if one and most and most["workers"] > 1:
            out[backend] = {"workers": most["workers"],
                            "ratio": round(most["candidates_per_minute"] / one["candidates_per_minute"], 3),
                            "ideal": most["workers"]}
    return out


def worker_counts(spec: str, device: str) -> list[int | None]:
    """'1,all' -> [1, N]: N is every visible GPU on cuda, half the cores on cpu (parent + child per job)."""
    every = visible_gpus() if device == "cuda" else max(1, (os.cpu_count() or 2) // 2)
    counts: list[int | None] = []
    for part in spec.split(","):
        n = every if part.strip() == "all" else int(part)
        if n not in counts:
            counts.append(n)
    return counts


def main(out: str, device: str = "auto", backends: str = "local,ray", workers: str = "1,all",
         strategies: str = DEFAULT_STRATEGIES, tasks: int | None = None, timing: str = "quick") -> dict:
    if device == "auto":
        device = "cuda" if visible_gpus() else "cpu"
    names = [s.strip() for s in strategies.split(",") if s.strip()]
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        raise SystemExit(f"unknown strategies {unknown}; known: {', '.join(STRATEGIES)}")
    jobs, used = build_jobs(device, names, tasks)
    chosen = [b.strip() for b in backends.split(",") if b.strip()]
    skipped = {}
    if "ray" in chosen and not ray_available():
        chosen.remove("ray")
        skipped["ray"] = "ray is not installed (pip install 'cuda-l1[ray]')"
    report = {**environment(device), "timing": timing, "strategies": used,
              "tasks": len({j.task.id for j in jobs}), "candidates": len(jobs), "skipped": skipped, "runs": []}
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    config = eval_config(device, timing)
    for backend in chosen:
        for count in worker_counts(workers, device):
            run = measure(backend, device, count, jobs, config)
            report["runs"].append(run)
            report["speedup"] = speedups(report["runs"])
            path.write_text(json.dumps(report, indent=2) + "\n")
            print(f"{backend:5s} workers={run['workers']:2d} {run['candidates']} candidates in {run['seconds']:.1f} s: "
                  f"{run['candidates_per_minute']} per minute {run['statuses']}", file=sys.stderr)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return report


def parse_args(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="where the JSON result is written")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"], help="worker device")
    parser.add_argument("--backends", default="local,ray", help="comma list of local, ray")
    parser.add_argument("--workers", default="1,all", help="comma list of worker counts; 'all' = every GPU")
    parser.add_argument("--strategies", default=DEFAULT_STRATEGIES, help="comma list of offline strategies")
    parser.add_argument("--tasks", type=int, default=None, help="use this many built-in tasks (default all)")
    parser.add_argument("--timing", default="quick", choices=["quick", "full", "off"],
                        help="timing protocol per candidate: quick, the full default protocol, or off")
    return vars(parser.parse_args(argv))


if __name__ == "__main__":
    main(**parse_args())
