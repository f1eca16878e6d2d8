"""What verification's full comparisons cost, with and without their fast paths (a script, not a test).

Times `precision.compare` (a candidate against the float64 oracle) and `verify.full_values` (against
the reference) on one output of N float32 values, first as shipped (the maxima read in one
synchronisation when everything is finite), then with the fast paths switched off (the masked path
for every chunk, as before 2026-12-02), and the comparison against the oracle as it was before
2026-12-04 (`compare_previous_s`: both outputs widened first, isfinite passes, abs then amax):

    python benchmarks/verify_cost.py --numel 33554432 --device cpu --out verify_cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from envinfo import environment  # noqa: E402

from cuda_l1.evaluate import precision, verify  # noqa: E402
from cuda_l1.evaluate.precision import ToleranceConfig, compare  # noqa: E402


def _best(fn, device: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


def _masked_beyond(got, expect, bound):
    """verify._beyond without its fast path."""
    got, expect = got.to(torch.float64), expect.to(torch.float64)
    diff = (got - expect).abs()
    diff[torch.isnan(diff) & (torch.isnan(got) & torch.isnan(expect) | (got == expect))] = 0.0
    if torch.isnan(diff).any() or (diff > bound).any():
        return float(torch.nan_to_num(diff, nan=float("inf")).max())
    return None


def _previous_finite_errors(c, o, r, tiny=None):
    """precision._finite_errors as it was before 2026-12-04: both outputs widened to float64 first,
    three isfinite passes, each maximum from abs() then amax(); and, as before 2026-12-06, no value
    judged by itself (no per-value counts)."""
    c, r = c.to(o.dtype), r.to(o.dtype)
    finite = torch.isfinite(c).all() & torch.isfinite(o).all() & torch.isfinite(r).all()
    stats = torch.stack([finite.to(torch.float64), (c - o).abs().amax().to(torch.float64),
                         (r - o).abs().amax().to(torch.float64), o.abs().amax().to(torch.float64)]).tolist()
    return (stats[1], stats[2], stats[3], 0, 0) if stats[0] else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--numel", type=int, default=1 << 25)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # as a side's verification runs: one core
    x = torch.randn(args.numel, device=args.device)
    ref = torch.nn.functional.gelu(x)
    cand, oracle = ref.clone(), torch.nn.functional.gelu(x.double())
    result = {"environment": environment(), "numel": args.numel, "device": args.device}
    result["compare_fast_s"] = _best(lambda: compare(cand, ref, oracle, ToleranceConfig()), args.device, args.repeats)
    result["full_fast_s"] = _best(lambda: verify.full_values(cand, ref, 1e-3), args.device, args.repeats)
    shipped_finite, shipped_beyond = precision._finite_errors, verify._beyond
    precision._finite_errors = _previous_finite_errors
    try:
        result["compare_previous_s"] = _best(lambda: compare(cand, ref, oracle, ToleranceConfig()), args.device,
                                             args.repeats)
    finally:
        precision._finite_errors = shipped_finite
    precision._finite_errors, verify._beyond = (lambda *a: None), _masked_beyond
    try:
        result["compare_masked_s"] = _best(lambda: compare(cand, ref, oracle, ToleranceConfig()), args.device, args.repeats)
        result["full_masked_s"] = _best(lambda: verify.full_values(cand, ref, 1e-3), args.device, args.repeats)
    finally:
        precision._finite_errors, verify._beyond = shipped_finite, shipped_beyond
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}))
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
