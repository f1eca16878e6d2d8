"""How much a large memory-bound operation's time varies on the GPU by itself, in one process.

Identical code on KernelBench's 6 GiB elementwise tasks needs 90-190 rounds of one call a window (H100):
each side's window (the parent's copy of the inputs into the side's buffer, then the call) varies by
about 7%, and so does the parent's own copy alone. This separates the GPU from the harness: the same
copy and a ReLU of the same size, timed by the host clock around a synchronise (as the parent times a
window) and by CUDA events, with the source fixed, made again in place each time (as a round's fresh
inputs are drawn), or allocated anew each time (a new block from the caching allocator), and
alternating between two destinations (as the two sides' buffers alternate).

    python benchmarks/gpu_copy_jitter.py --gib 6 --repeats 40 --out OUT/copy-jitter.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _stats(values: list[float]) -> dict:
    med = statistics.median(values)
    return {"median_ms": round(med, 4), "sd_ms": round(statistics.pstdev(values), 4),
            "sd_share": round(statistics.pstdev(values) / med, 4) if med else None,
            "min_ms": round(min(values), 4), "max_ms": round(max(values), 4), "n": len(values)}


def _timed(op, device) -> tuple[float, float]:
    """(host ms around a synchronise, event ms) of one call of `op`."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    start.record()
    op()
    end.record()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1e3, start.elapsed_time(end)


def run(gib: float, repeats: int, device: str) -> dict:
    numel = int(gib * 2**30) // 4
    src = torch.randn(numel, device=device)
    dsts = [torch.empty(numel, device=device) for _ in range(2)]
    modes = {}

    def measure(name, prepare, op):
        host, events = [], []
        for i in range(repeats):
            prepare(i)
            h, e = _timed(lambda: op(i), device)
            host.append(h)
            events.append(e)
        modes[name] = {"host": _stats(host), "events": _stats(events)}

    holder = {"src": src}
    measure("copy, fixed source and destination", lambda i: None, lambda i: dsts[0].copy_(src))
    measure("copy, two destinations in turn", lambda i: None, lambda i: dsts[i % 2].copy_(src))
    measure("copy, source drawn again in place", lambda i: src.normal_(), lambda i: dsts[i % 2].copy_(src))

    def fresh(i):
        holder["src"] = None
        torch.cuda.synchronize(device)
        holder["src"] = torch.randn(numel, device=device)

    measure("copy, source allocated anew", fresh, lambda i: dsts[i % 2].copy_(holder["src"]))
    holder["src"] = None
    measure("relu into a fixed output", lambda i: None, lambda i: torch.clamp_min(src, 0.0, out=dsts[0]))
    measure("relu into a new output", lambda i: None, lambda i: torch.relu(src))
    return modes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=6.0, help="bytes of each buffer, in GiB")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("no CUDA device: this measures the GPU")
    device = torch.device(args.device)
    if device.index is None:  # "cuda": the current device (set_device wants an index)
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    modes = run(args.gib, args.repeats, str(device))
    result = {"environment": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
              "gib": args.gib, "repeats": args.repeats, "modes": modes}
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    for name, m in modes.items():
        print(f"{name:40s} host {m['host']['median_ms']:8.3f} ms sd {m['host']['sd_share']:.3f}   "
              f"events {m['events']['median_ms']:8.3f} ms sd {m['events']['sd_share']:.3f}")


if __name__ == "__main__":
    main()
