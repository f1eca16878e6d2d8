"""What a per-call doorbell would cost on a GPU (a script, not a test): the numbers a GPU version of the
CPU's gating (docs/isolation.md, honest limits) has to be decided on.

On a CPU the parent writes call k+1's inputs only after call k rang, so no call sees a later call's
inputs; on a GPU every slot is in the side's buffer from the window's start and a window's calls can
be batched into one (corpus case `batch_window_gpu`). A GPU doorbell needs, per call: the side
synchronising its device before it rings, the parent writing the next slot from its own CUDA context
(another context on the same GPU: a context switch a call), and reading a few positions of the call's
outputs through IPC to see they were final at the ring. This script measures each of those, in a
parent and a spawned child on one GPU, for an operation of a chosen size:

- `batched`: the child's n calls back to back, one synchronisation at the end (today's window);
- `sync`: the child synchronises after every call (no parent in the loop);
- `ring`: the child synchronises and rings a shared word after every call; the parent polls it and
  says go for the next call (the CPU handshake alone);
- `ring_copy`: as `ring`, and the parent first copies the next slot's inputs into the buffer the child
  maps, from its own context, and waits for that copy;
- `ring_copy_gather`: as `ring_copy`, and the parent first reads 8 positions of the call's output
  (mapped from the child) to the host;
- `ring_h2d`: the next slot's values go through host memory instead: after call k rang the parent
  writes slot k+1 into a shared host buffer (a CPU copy) and says go; the child copies it to its
  device slot from its own context (pinned: `cudaHostRegister`) before the call. No parent context
  on the GPU in the loop;
- `ring_h2d_sampled`: as `ring_h2d`, and at 4 rings of each window, drawn at random, the parent reads
  8 positions of the call's output from its own context (the check that the output was final at the
  ring, on a sample); `sampled_net` is the same per call with the parent's reading time taken off.

Prints and writes (with --out) the median time a call of each, over --repeats windows of --calls calls.

    python benchmarks/gpu_ring_cost.py --op tanh --numel 1024 262144 16777216 --out ring.json
    python benchmarks/gpu_ring_cost.py --op matmul --numel 65536 1048576 --out ring-mm.json

(matmul: a square matrix of numel elements times itself). On a host without a GPU it runs on the CPU,
with shared memory standing for IPC: a check of the script, not a measurement of anything GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time
from multiprocessing import shared_memory
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))

from envinfo import environment  # noqa: E402

GO, RING = 0, 1  # words of the shared page: the parent's go, the child's ring
MODES = ("batched", "sync", "ring", "ring_copy", "ring_copy_gather", "ring_h2d", "ring_h2d_sampled")
SPOTS = 8  # positions the parent reads a call (gating.SPOTS on a CPU)
SAMPLED = 4  # rings of a window at which ring_h2d_sampled reads the output
HOST_STAGED = ("ring_h2d", "ring_h2d_sampled")


def _words(shm: shared_memory.SharedMemory):
    return (ctypes.c_uint64 * 2).from_buffer(shm.buf)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _op(name: str, x: torch.Tensor, out: torch.Tensor) -> None:
    if name == "tanh":
        torch.tanh(x, out=out)
    else:
        side = math.isqrt(x.numel())
        m = x.view(side, side)
        torch.matmul(m, m, out=out.view(side, side))


def _host_view(shm: shared_memory.SharedMemory, calls: int, numel: int) -> torch.Tensor:
    return torch.frombuffer(shm.buf, dtype=torch.float32, count=calls * numel).view(calls, numel)


def _child(conn, shm_name: str, device: str, core: int | None) -> None:
    """The side: maps the parent's input slots, owns its output slots (sent to the parent), runs windows."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    shm = shared_memory.SharedMemory(name=shm_name)
    words = _words(shm)
    inputs, op, host_name = conn.recv()
    host_shm = shared_memory.SharedMemory(name=host_name)
    host = _host_view(host_shm, *inputs.shape)
    if device.startswith("cuda"):  # pinned, so that a copy from it is a DMA, as a harness would register it
        torch.cuda.cudart().cudaHostRegister(host.data_ptr(), host.numel() * 4, 0)
    outputs = torch.empty_like(inputs)
    conn.send(outputs)  # the parent maps them (IPC on a GPU, shared memory on a CPU)
    while (msg := conn.recv()) is not None:
        mode, n, base = msg
        _sync(device)
        t0 = time.perf_counter()
        if mode == "batched":
            for k in range(n):
                _op(op, inputs[k], outputs[k])
            _sync(device)
        elif mode == "sync":
            for k in range(n):
                _op(op, inputs[k], outputs[k])
                _sync(device)
        else:
            staged = mode in HOST_STAGED
            for k in range(n):
                while words[GO] != base + k:
                    pass
                if staged:
                    inputs[k].copy_(host[k], non_blocking=True)
                _op(op, inputs[k], outputs[k])
                _sync(device)
                words[RING] = base + k + 1
        conn.send(time.perf_counter() - t0)
    if device.startswith("cuda"):
        torch.cuda.cudart().cudaHostUnregister(host.data_ptr())
    del words, host
    shm.close()
    host_shm.close()


def measure(op: str, numel: int, calls: int, repeats: int, device: str) -> dict:
    ctx = mp.get_context("spawn")
    shm = shared_memory.SharedMemory(create=True, size=4096)
    host_shm = shared_memory.SharedMemory(create=True, size=calls * numel * 4)
    words = _words(shm)
    host = _host_view(host_shm, calls, numel)
    ours, theirs = ctx.Pipe()
    cores = sorted(os.sched_getaffinity(0))
    child = ctx.Process(target=_child, args=(theirs, shm.name, device, cores[-1] if len(cores) > 1 else None))
    child.start()
    if len(cores) > 1:
        os.sched_setaffinity(0, set(cores[:-1]))
    try:
        inputs = torch.randn(calls, numel, device=device)
        if device == "cpu":
            inputs.share_memory_()
        staging = torch.randn(calls, numel, device=device)  # the next slots' values, the parent's alone
        staging_host = staging.cpu()
        ours.send((inputs, op, host_shm.name))
        outputs = ours.recv()
        spots = torch.randint(0, numel, (SPOTS,), device=device)
        base, results = 1, {mode: [] for mode in MODES}
        results["sampled_net"] = []
        rng = torch.Generator().manual_seed(0)
        for _ in range(repeats):
            for mode in MODES:
                words[GO], words[RING] = 0, 0
                if mode in HOST_STAGED:
                    host[0].copy_(staging_host[0])  # slot 0 before the window, as on a CPU
                ours.send((mode, calls, base))
                if mode in ("batched", "sync"):
                    results[mode].append(ours.recv() / calls)
                    continue
                sampled = set(torch.randperm(calls, generator=rng)[:SAMPLED].tolist()) if mode == "ring_h2d_sampled" else ()
                reading = 0.0
                t0 = time.perf_counter()
                words[GO] = base
                for k in range(calls):
                    while words[RING] != base + k + 1:
                        pass
                    if mode == "ring_copy_gather" or k in sampled:
                        r0 = time.perf_counter()
                        outputs[k][spots].cpu()  # a few positions of call k's output, to the host
                        reading += time.perf_counter() - r0
                    if mode in HOST_STAGED:
                        if k + 1 < calls:  # one plain copy on this thread: on an H100 host torch's
                            # copy_ took about 8 ms a call at any size from 1 MiB (its thread pool, we
                            # think; not profiled), memmove 0.27 ms at 1 MiB and 12 ms at 64 MiB
                            ctypes.memmove(host[k + 1].data_ptr(), staging_host[k + 1].data_ptr(), numel * 4)
                    elif mode != "ring" and k + 1 < calls:
                        inputs[k + 1].copy_(staging[k + 1])
                        _sync(device)
                    words[GO] = base + k + 1
                elapsed = time.perf_counter() - t0
                results[mode].append(elapsed / calls)
                if mode == "ring_h2d_sampled":
                    results["sampled_net"].append((elapsed - reading) / calls)
                ours.recv()
                base += calls + 1
        ours.send(None)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
        del words, host
        shm.close()
        shm.unlink()
        host_shm.close()
        host_shm.unlink()
    median = {mode: statistics.median(times) * 1e6 for mode, times in results.items()}
    return {"op": op, "numel": numel, "calls": calls, "repeats": repeats, "per_call_us": median,
            "added_us": {mode: median[mode] - median["batched"] for mode in median if mode != "batched"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=("tanh", "matmul"), default="tanh")
    parser.add_argument("--numel", type=int, nargs="+", default=[1024, 262144, 16777216],
                        help="elements of one call's input (matmul: a perfect square)")
    parser.add_argument("--calls", type=int, default=32, help="calls a window")
    parser.add_argument("--repeats", type=int, default=30, help="windows of each mode")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.op == "matmul" and any(math.isqrt(n) ** 2 != n for n in args.numel):
        parser.error("--op matmul needs every --numel to be a perfect square")
    rows = []
    for numel in args.numel:
        row = measure(args.op, numel, args.calls, args.repeats, args.device)
        rows.append(row)
        print(f"{args.op} {numel:>10}: " + "  ".join(f"{mode} {us:8.1f} us" for mode, us in row["per_call_us"].items()),
              flush=True)
    if args.out:
        args.out.write_text(json.dumps({"environment": environment(), "device": args.device, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
