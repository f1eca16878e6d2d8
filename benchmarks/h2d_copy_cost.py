"""What a call costs when its inputs come from host memory (a script, not a test): one process, a window
of --calls calls, each an H2D copy of one slot, a tanh and a device synchronisation, from host memory
that is pageable, pinned by torch, shared (a POSIX shared-memory segment, as a parent would write a
side's next slot into) and not registered, or shared and registered with cudaHostRegister.

The one-process half of benchmarks/gpu_ring_cost.py's `ring_h2d` mode: what the copy itself costs,
without a parent in the loop. Needs a CUDA device.

    python benchmarks/h2d_copy_cost.py --numel 1024 262144
"""

from __future__ import annotations

import argparse
import statistics
import time
from multiprocessing import shared_memory

import torch


def per_call_us(src: torch.Tensor, dst: torch.Tensor, out: torch.Tensor, repeats: int, non_blocking: bool) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for k in range(dst.shape[0]):
            dst[k].copy_(src[k], non_blocking=non_blocking)
            torch.tanh(dst[k], out=out[k])
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / dst.shape[0])
    return statistics.median(times) * 1e6


def measure(numel: int, calls: int, repeats: int) -> dict:
    dst = torch.empty(calls, numel, device="cuda")
    out = torch.empty_like(dst)
    rows = {"pageable": per_call_us(torch.randn(calls, numel), dst, out, repeats, True),
            "torch_pinned": per_call_us(torch.randn(calls, numel).pin_memory(), dst, out, repeats, True)}
    shm = shared_memory.SharedMemory(create=True, size=calls * numel * 4)
    try:
        host = torch.frombuffer(shm.buf, dtype=torch.float32, count=calls * numel).view(calls, numel)
        host.copy_(torch.randn(calls, numel))
        rows["shared"] = per_call_us(host, dst, out, repeats, True)
        rc = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), host.numel() * 4, 0)
        if int(rc) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {rc}")
        rows["shared_registered"] = per_call_us(host, dst, out, repeats, True)
        rows["shared_registered_blocking"] = per_call_us(host, dst, out, repeats, False)
        torch.cuda.cudart().cudaHostUnregister(host.data_ptr())
        del host
    finally:
        shm.close()
        shm.unlink()
    return {"numel": numel, "calls": calls, "repeats": repeats, "per_call_us": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--numel", type=int, nargs="+", default=[1024, 262144])
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    for numel in args.numel:
        row = measure(numel, args.calls, args.repeats)
        print(f"{numel:>10}: " + "  ".join(f"{k} {v:7.1f} us" for k, v in row["per_call_us"].items()), flush=True)


if __name__ == "__main__":
    main()
