"""Per-round times of identical code, for finding where a bias between the two sides comes from (a
script, not a test). Each task's reference is evaluated as its own candidate `--repeats` times; every
round's per-call times and which side went first are written out with the verdict's summary.

    python benchmarks/identical_rounds.py --device cuda --tasks L1/02_TallSkinnyMatmul,L2/01 --out rounds.json
    python benchmarks/identical_rounds.py --device cuda --tasks tests/corpus/refs/many_small_ops.py --checked-calls 1 --out r.json

Ablations that each remove one difference between the sides: --fresh-reference (both processes
equally new; EvalConfig.fresh_reference does that by default on a CPU, and --kept-reference undoes it), --cpu-core (both on one core), --no-prewarm, --checked-calls 1 (on a GPU the reference's
side compares the candidate's outputs between windows: this makes that work an eighth as large).
Diagnostics that change the referee here only (never a policy): --release-each-round (the reference's
side closes the candidate's IPC handles after every verification), --gap-ms N (a pause after every
verification), --busy-ms N (the parent keeps the GPU busy with a trusted matmul loop that long after
every verification), --no-verify (no verification at all: does the bias come from it?), --touch SIDE (an
empty, unrecorded window of that side after every verification: is what helps the reference's next
window its own process having just worked?), --spin-reply-ms N (the parent polls for each reply that
long before sleeping: is waking its core part of a window's jitter?).

Where a round's noise comes from: every recorded window's parts are written out too (`windows`: per
round, the reference's and the candidate's wall, start (inputs written and side resumed: up to the
request), request-to-reply and idle-wait milliseconds; what is left of the wall is stopping the
side), and --input-memory-gib sets the input slots' budget (EvalConfig.input_memory_bytes; default
two fifths of the GPU, at most half its free memory): more slots, more calls a window, for the memory-bound tasks whose few calls a
window leave their rounds noisy.
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
from cuda_l1.tasks.loaders import load_tasks  # noqa: E402
from cuda_l1.tasks.sizes import for_device  # noqa: E402


def _ratio_by_order(samples: dict) -> dict:
    """Median reference/candidate ratio of the rounds where the candidate went first, and second."""
    out = {}
    for first in (True, False):
        ratios = [r / c for r, c, f in zip(samples["reference_ms"], samples["candidate_ms"], samples["candidate_first"])
                  if f is first and c > 0]
        out["candidate_first" if first else "reference_first"] = (statistics.median(ratios), len(ratios)) if ratios else None
    return out


recorded: list = []  # each evaluation's recorded windows (_diagnostics), in order


def _window_spread(rounds: list) -> dict:
    """Per side, how much each part of its windows strays from round to round (median absolute
    deviation scaled to a standard deviation, ms): which part carries a round's noise."""
    out = {}
    for side, base in (("reference", 0), ("candidate", 5)):
        parts = {"wall": [], "start": [], "reply": [], "stop": [], "idle": []}
        for r in rounds:
            wall, start, reply, idle = r[base:base + 4]
            for name, value in (("wall", wall), ("start", start), ("reply", reply), ("idle", idle),
                                ("stop", wall - start - reply - idle)):
                parts[name].append(value)
        out[side] = {k: round(1.4826 * statistics.median([abs(x - statistics.median(v)) for x in v]), 4)
                     for k, v in parts.items() if v}
    return out


def _spin_for_replies(seconds: float) -> None:
    """Diagnostic: the parent polls a side's channel for up to `seconds` before it sleeps on it, so a
    reply finds it running (is waking the parent's core part of a window's jitter?). The sides'
    own channels are not changed: they live in other processes."""
    import os
    import select

    from cuda_l1.evaluate.channel import Channel

    fill = Channel._fill

    def spinning_fill(self, need: int, deadline: float | None) -> None:
        end = time.perf_counter() + seconds
        while len(self._buffer) < need and time.perf_counter() < end:
            if select.select([self.read_fd], [], [], 0)[0]:
                chunk = os.read(self.read_fd, max(need - len(self._buffer), 1 << 20))
                if not chunk:
                    break  # closed: the original reports it
                self._buffer += chunk
        fill(self, need, deadline)

    Channel._fill = spinning_fill


def _diagnostics(args) -> None:
    """Changes to the referee for this script's run only (see the module's help)."""
    from cuda_l1.evaluate.protocol import Mapped, Release
    from cuda_l1.evaluate.referee import Referee

    if args.spin_reply_ms:
        _spin_for_replies(args.spin_reply_ms / 1000)

    verify = Referee.verify_round

    def verify_round(self, round_no):
        if args.no_verify:
            self.previous_calls = list(self.cand.ran.calls)
        else:
            verify(self, round_no)
        if args.release_each_round and self.config.device.startswith("cuda"):
            ref = self.env.ref.proc
            ref.thaw()
            try:
                ref.request(Release(), self.config.call_timeout_s, Mapped)
            finally:
                ref.freeze()
        if args.gap_ms:
            time.sleep(args.gap_ms / 1000)
        if args.busy_ms and self.config.device.startswith("cuda"):
            import torch

            if not busy:
                busy.append(torch.randn(2048, 2048, device=self.config.device))
            end = time.perf_counter() + args.busy_ms / 1000
            while time.perf_counter() < end:
                busy[0] @ busy[0]
                torch.cuda.synchronize(self.config.device)
        if args.touch and self.status is None:
            from cuda_l1.evaluate import windows

            side = self.cand if args.touch == "candidate" else self.env.ref
            kept = side.window, side.ran
            windows.run(self.env, side, [], self.config.call_timeout_s, None, 0, first=False,
                        remaining=self.remaining, builds=self.builds)
            side.window, side.ran = kept
            self.previous_calls = []  # the empty window let the side drop its outputs: their memory is free

    busy = []  # the trusted workload's operand, made once
    finish = Referee._finish

    def keep_windows(self, *rest):
        recorded.append([[round(x * 1e3, 4) for x in (w.wall_s, w.start_s, w.reply_s, w.idle_wait_s)] + [w.calls]
                         for pair in self.windows for w in pair])
        return finish(self, *rest)

    Referee._finish = keep_windows
    if args.no_verify or args.release_each_round or args.gap_ms or args.busy_ms or args.touch:
        Referee.verify_round = verify_round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", choices=("cpu", "gpu"), default=None,
                        help="built-in suite sizes (default: gpu on a CUDA device, cpu otherwise)")
    parser.add_argument("--tasks", required=True,
                        help="built-in task keys or key prefixes, or task files (.py), comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-prewarm", action="store_true", help="start each candidate process only when needed")
    parser.add_argument("--cpu-core", type=int, default=None, help="pin both sides to this core (on a GPU too)")
    parser.add_argument("--fresh-reference", action="store_true",
                        help="a new evaluator, reference side included, for every evaluation (both sides equally fresh)")
    parser.add_argument("--kept-reference", action="store_true",
                        help="EvalConfig.fresh_reference=False: one reference side serves every repeat (a CPU's "
                             "default before it was a fresh one each)")
    parser.add_argument("--checked-calls", type=int, default=None, help="calls compared after each window (default 8)")
    parser.add_argument("--release-each-round", action="store_true",
                        help="diagnostic: the reference's side closes the candidate's handles after every verification")
    parser.add_argument("--gap-ms", type=float, default=0.0, help="diagnostic: pause this long after every verification")
    parser.add_argument("--busy-ms", type=float, default=0.0,
                        help="diagnostic: keep the GPU busy (the parent's matmuls) this long after every verification")
    parser.add_argument("--no-verify", action="store_true", help="diagnostic: skip verification (outputs unchecked)")
    parser.add_argument("--touch", choices=("candidate", "reference"), default=None,
                        help="diagnostic: an empty, unrecorded window of this side after every verification")
    parser.add_argument("--input-memory-gib", type=float, default=None,
                        help="budget of the input slots (EvalConfig.input_memory_bytes), GiB")
    parser.add_argument("--spin-reply-ms", type=float, default=0.0,
                        help="diagnostic: the parent polls for a side's reply this long before sleeping on it")
    parser.add_argument("--settle-ms", type=float, default=None,
                        help="TimingConfig.settle_s, in ms (default: its default): the pause after each verification")
    parser.add_argument("--oracle-rate", type=float, default=None,
                        help="TimingConfig.oracle_rate (default: its default): 0 leaves the float64 oracle to round 1")
    args = parser.parse_args()
    _diagnostics(args)
    wanted = [t for t in args.tasks.split(",") if t and not t.endswith(".py")]
    files = [t for t in args.tasks.split(",") if t.endswith(".py")]
    tasks = [t for t in load_tasks(f"builtin:{args.sizes}" if args.sizes else for_device("builtin", args.device))
             if any(t.key.startswith(w) for w in wanted)] if wanted else []
    tasks += [task for path in files for task in load_tasks(path)]
    rows = []
    for task in tasks:
        memory = int(args.input_memory_gib * (1 << 30)) if args.input_memory_gib else None
        config = EvalConfig(device=args.device, prewarm=False if args.no_prewarm else None, cpu_core=args.cpu_core,
                            input_memory_bytes=memory, fresh_reference=False if args.kept_reference else None)
        if args.checked_calls:
            config = dataclasses.replace(config, timing=dataclasses.replace(config.timing, checked_calls=args.checked_calls))
        if args.settle_ms is not None:
            config = dataclasses.replace(config, timing=dataclasses.replace(config.timing, settle_s=args.settle_ms / 1000))
        if args.oracle_rate is not None:
            config = dataclasses.replace(config, timing=dataclasses.replace(config.timing, oracle_rate=args.oracle_rate))
        evaluator = Evaluator(task, config)
        # The reference's own class under the candidate's name; `Model` names it too (KernelBench's classes
        # call super(Model, self).__init__(), which found no Model once renamed)
        source = task.source.replace("class Model(", "class ModelNew(") + "\n\nModel = ModelNew\n"
        try:
            for repeat in range(args.repeats):
                if args.fresh_reference and repeat:
                    evaluator.close()
                    evaluator = Evaluator(task, config)
                t0 = time.perf_counter()
                verdict = evaluator.evaluate(source)
                samples = verdict.timing.get("samples") or {"reference_ms": [], "candidate_ms": [], "candidate_first": []}
                row = {"task": task.key, "repeat": repeat, "status": verdict.status, "raw": verdict.raw_speedup,
                       "score": verdict.speedup, "seconds": round(time.perf_counter() - t0, 2),
                       "by_order": _ratio_by_order(samples), "calls_per_window": verdict.timing.get("calls_per_window"),
                       "overhead_ms": verdict.timing.get("window_overhead_ms"), "cpu_core": verdict.sandbox.get("cpu_core"),
                       "phases_s": verdict.timing.get("phases_s"), "reasons": verdict.reasons[:2],
                       "sides": verdict.timing.get("sides"),  # each side's process counters (page faults)
                       "samples": samples,
                       # a round: [reference wall, start, reply, idle wait (ms), calls, then the candidate's]
                       "windows": [a + b for a, b in zip(recorded[-1][::2], recorded[-1][1::2])] if recorded else []}
                recorded.clear()
                row["window_spread_ms"] = _window_spread(row["windows"])
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k not in ("samples", "windows")}), flush=True)
        finally:
            evaluator.close()
    Path(args.out).write_text(json.dumps({"environment": environment(), "rows": rows}))


if __name__ == "__main__":
    main()
