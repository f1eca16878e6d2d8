"""What the per-call doorbell costs a CPU window (a script, not a test): the reference's side of a task
file, run through `windows.run` as the referee runs it, in null windows (as many rings as calls, no
calls) and real windows of N calls; the per-call time net of the shortest null window is what the
referee's statistics see. Run it from a checkout before the doorbell for the comparison.

    python benchmarks/doorbell_cost.py tests/corpus/refs/tiny_relu.py --calls 200
"""

from __future__ import annotations

import argparse
import statistics

from cuda_l1.evaluate import windows
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.tasks import load_task_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", help="a task file (Model, get_inputs, get_init_inputs)")
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--windows", type=int, default=30, help="of each kind, per repeat")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    evaluator = Evaluator(load_task_file(args.task), EvalConfig(device="cpu"))
    env = evaluator.env
    env.start_reference()
    env.calibrate_quiet()
    inputs = env.source.fresh(args.calls)

    def window(slots: list[int], written: int) -> float:
        windows.run(env, env.ref, slots, 15.0, inputs, written, first=False, remaining=lambda: 100.0, builds=[])
        return env.ref.window.wall_s

    try:
        window([0], 1)
        for _ in range(args.repeats):
            nulls = [window([], args.calls) for _ in range(args.windows)]
            reals = [window(list(range(args.calls)), args.calls) for _ in range(args.windows)]
            net = (statistics.median(reals) - min(nulls)) / args.calls
            print(f"{args.calls} calls: null window min {min(nulls) * 1e3:.3f} ms, median {statistics.median(nulls) * 1e3:.3f};"
                  f" real window median {statistics.median(reals) * 1e3:.3f} ms; per call net {net * 1e3:.4f} ms")
    finally:
        evaluator.close()


if __name__ == "__main__":
    main()
