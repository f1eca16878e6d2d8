"""Time every built-in reference at its CPU and GPU sizes on one GPU (a script, not a test).

    python benchmarks/builtin_sizes.py --out OUT/builtin-sizes.json [--repeats 20] [--tasks L1/01,L2/03]
    python benchmarks/builtin_sizes.py --shapes-only        # no GPU: input/output/parameter sizes, on meta

GPU_SIZES aim at >= 0.5 ms per reference call on an H100-class GPU (tasks/sizes.py); this measures
them: median of `--repeats` calls after warm-up, CUDA events, fresh inputs from get_inputs once.
Plain eager PyTorch in this process: no sandbox, no evaluator, just the references.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types

import torch

from cuda_l1.tasks import load_builtin
from cuda_l1.tasks.runtime import meta_footprint
from cuda_l1.tasks.sizes import GPU_TARGET_MS


def time_reference(source: str, repeats: int) -> dict:
    module = types.ModuleType("builtin_task")
    exec(compile(source, "<task>", "exec"), module.__dict__)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = module.Model(*module.get_init_inputs())
        inputs = module.get_inputs()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in inputs]
    model = model.cuda() if isinstance(model, torch.nn.Module) else model
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(*inputs)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    peak = torch.cuda.max_memory_allocated() / 2**30
    del model, inputs
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return {"median_ms": statistics.median(times), "min_ms": min(times), "peak_gib": round(peak, 2)}


def shapes(source: str) -> dict:
    """Input and output MiB and parameter count of one size, built and run on the meta device."""
    footprint = meta_footprint(source)
    return {"inputs_mib": round(footprint["input_bytes"] / 2**20), "outputs_mib": round(footprint["output_bytes"] / 2**20),
            "parameters": footprint["parameters"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="where the JSON results go (required unless --shapes-only)")
    parser.add_argument("--shapes-only", action="store_true", help="print each GPU size's tensor sizes (no GPU needed)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per task and size")
    parser.add_argument("--tasks", default="", help="comma-separated task keys (default: all)")
    args = parser.parse_args(argv)
    if args.shapes_only:
        for task in load_builtin("gpu"):
            print(json.dumps({"task": task.key, **shapes(task.source)}))
        return 0
    if not args.out:
        parser.error("--out is required")
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    wanted = {k.strip() for k in args.tasks.split(",") if k.strip()}
    rows = []
    for sizes in ("cpu", "gpu"):
        for task in load_builtin(sizes):
            if wanted and task.key not in wanted and not any(task.key.startswith(w) for w in wanted):
                continue
            started = time.perf_counter()
            try:
                row = time_reference(task.source, args.repeats)
            except Exception as exc:  # a size that does not fit or fails is a result too
                row = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                torch.cuda.empty_cache()
            row.update(task=task.key, sizes=sizes, wall_s=round(time.perf_counter() - started, 1))
            if "median_ms" in row:
                row["meets_target"] = row["median_ms"] >= GPU_TARGET_MS
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "target_ms": GPU_TARGET_MS,
              "date": time.strftime("%Y-%m-%d"), "rows": rows}
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=2)
    gpu_rows = [r for r in rows if r["sizes"] == "gpu" and "median_ms" in r]
    print(f"gpu sizes meeting {GPU_TARGET_MS} ms: {sum(r['meets_target'] for r in gpu_rows)}/{len(gpu_rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
