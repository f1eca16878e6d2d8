"""What preloading torch.compile's modules in the fork server (fork_preload.py) saves a torch.compile
candidate: the same `compile` strategy candidate judged REPEATS times by a server with the preload
and by one without, each verdict with a fresh evaluator; prints the verdicts' load and whole times.
A script, not a test:

    python benchmarks/preload_effect.py --device cuda --task L1/19_ReLU --source KernelBench/KernelBench
    python benchmarks/preload_effect.py --device cpu      # a built-in level-1 task
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

from cuda_l1.evaluate.config import EvalConfig, TimingConfig  # noqa: E402
from cuda_l1.evaluate.evaluator import Evaluator  # noqa: E402
from cuda_l1.strategies import get_strategy  # noqa: E402
from cuda_l1.tasks.loaders import load_tasks  # noqa: E402


def judged(task, source: str, device: str, preload: bool) -> dict:
    timing = TimingConfig.quick()
    config = EvalConfig(device=device, timing=timing)
    config.sandbox.preload_compilers = preload
    started = time.perf_counter()
    evaluator = Evaluator(task, config)
    try:
        verdict = evaluator.evaluate(source)
    finally:
        evaluator.close()
    return {"status": verdict.status, "seconds": round(time.perf_counter() - started, 2),
            "load_s": (verdict.timing or {}).get("phases_s", {}).get("load"),
            "preloaded": verdict.sandbox.get("preloaded", "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--source", default="builtin", help="task source (builtin or a KernelBench directory)")
    parser.add_argument("--task", default="", help="level-1 task: its name or L1/NAME (default: the source's first)")
    parser.add_argument("--repeats", type=int, default=3, help="verdicts per server kind")
    parser.add_argument("--out", default="", help="also write the JSON here")
    args = parser.parse_args()
    tasks = load_tasks(args.source, levels={1})
    named = [t for t in tasks if args.task in (t.id, t.name, f"L{t.level}/{t.name}")]
    if args.task and not named:
        raise SystemExit(f"preload_effect.py: no level-1 task {args.task!r} in {args.source}")
    task = named[0] if named else tasks[0]
    source = get_strategy("compile").generate(task)
    result = {"task": f"L{task.level}/{task.name}", "device": args.device, "environment": environment()}
    for kind, preload in (("preloaded", True), ("not_preloaded", False)):
        rows = [judged(task, source, args.device, preload) for _ in range(args.repeats)]
        loads = [r["load_s"] for r in rows if r["load_s"] is not None]
        result[kind] = {"verdicts": rows, "median_load_s": statistics.median(loads) if loads else None,
                        "median_seconds": statistics.median(r["seconds"] for r in rows)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
