"""Is memory slower once an IPC handle to it has been exported? (A script, not a test; needs a GPU.)

On a GPU the candidate's side exports an IPC handle for each allocation its outputs live in (so the
reference's side can read them) and the reference's side exports none. Identical code then reads
1-4% slower as the candidate on memory-bound tasks (GELU, RMSNorm, LayerNorm), and the bias went
away in one ablation where the reference's side exported handles too. This script separates the
two possible causes in one process: the export call itself (paid once per allocation) and the
memory behind an exported handle. It allocates pairs of equal buffers straight from the driver,
exports a handle to one of each pair, and times the same memory-bound operations writing into
(and reading from) each, alternating, with CUDA events.

    python benchmarks/export_cost.py --out OUT/export_cost.json
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


def timed(fn, reps: int) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--mib", type=int, default=512, help="size of each buffer")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--reps", type=int, default=10, help="calls per timed window")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch

    from cuda_l1.evaluate import cudadrv

    device, nbytes = args.device, args.mib << 20
    torch.zeros(1, device=device)
    buffers = {}
    export_s = []
    for name in ("plain_out", "exported_out", "plain_in", "exported_in"):
        ptr = cudadrv.alloc(device, nbytes)
        if name.startswith("exported"):
            t0 = time.perf_counter()
            cudadrv.export_base(ptr)
            export_s.append(time.perf_counter() - t0)
        buffers[name] = cudadrv.tensor_at(device, ptr, nbytes).view(torch.float32)
    for t in buffers.values():
        t.normal_()
    x = torch.randn(nbytes // 4, device=device)
    ops = {
        "gelu_into": {side: (lambda o=buffers[f"{side}_out"]: torch.ops.aten.gelu.out(x, out=o))
                      for side in ("plain", "exported")},
        "add_into": {side: (lambda o=buffers[f"{side}_out"]: torch.add(x, 1.0, out=o)) for side in ("plain", "exported")},
        "gelu_from": {side: (lambda i=buffers[f"{side}_in"]: torch.ops.aten.gelu.out(i, out=x))
                      for side in ("plain", "exported")},
    }
    results = {}
    for op, sides in ops.items():
        for fn in sides.values():
            timed(fn, args.reps)  # warm-up
        samples = {side: [] for side in sides}
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(list(sides)))
            for side in order:
                samples[side].append(timed(sides[side], args.reps))
        plain, exported = statistics.median(samples["plain"]), statistics.median(samples["exported"])
        results[op] = {"plain_ms": plain, "exported_ms": exported, "exported_over_plain": exported / plain,
                       "samples": samples}
        print(f"{op:10s} plain {plain:.4f} ms  exported {exported:.4f} ms  ratio {exported / plain:.4f}", flush=True)
    record = {"environment": environment(), "buffer_mib": args.mib, "export_call_s": export_s, "ops": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
