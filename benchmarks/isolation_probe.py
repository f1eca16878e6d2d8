"""What the evaluator's isolation design rests on, measured on the machine at hand.

    python benchmarks/isolation_probe.py --out results.json

1. Can a trusted process see that *another* process left work on the GPU? A probe (a one-element
   kernel and a synchronize, from its own CUDA context) is timed while the GPU is idle, and while a
   second process has queued work without waiting for it (large kernels, many small ones, and with that
   process stopped by SIGSTOP right after it launched). The design charges a side until probes come
   back at idle speed, so probes must stay slow while foreign work is pending.
2. CUDA IPC between processes: export and open costs, and whether the bytes read back are right.
3. Whether CUDA still initialises in a child that entered new PID, network and mount namespaces and
   dropped to an unprivileged uid.
4. process_vm_readv of a stopped child's memory.
Facts about the machine (uid, kernel, device-node permissions, cgroup mounts) are recorded too.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))


def _facts() -> dict:
    def read(path):
        try:
            with open(path) as fh:
                return fh.read().strip()
        except OSError as exc:
            return f"unreadable: {exc.strerror}"

    nodes = {}
    for name in sorted(os.listdir("/dev")):
        if name.startswith("nvidia"):
            st = os.stat(f"/dev/{name}")
            nodes[name] = oct(st.st_mode & 0o777)
    from cuda_l1.evaluate.confine import landlock_abi

    return {"uid": os.getuid(), "kernel": os.uname().release, "nvidia_nodes": nodes,
            "cgroup_mounts": [l for l in read("/proc/mounts").splitlines() if "cgroup" in l],
            "ptrace_scope": read("/proc/sys/kernel/yama/ptrace_scope"), "landlock_abi": landlock_abi(),
            "cpus": os.cpu_count()}


# -- worker side -------------------------------------------------------------------------------------
def worker(mode: str) -> None:
    import torch

    dev = "cuda:0"
    if mode in ("big", "many", "stopped"):
        a = torch.randn(4096, 4096, device=dev)
        small = torch.randn(1 << 18, device=dev)
        torch.cuda.synchronize()
        for _ in range(3):  # warm
            (a @ a)
            small.add_(1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if mode == "many":
            for _ in range(20000):
                small.add_(1.0)
        else:
            for _ in range(40):
                a = a @ a * 1e-3
        launched = time.perf_counter()
        print(f"launched {launched - t0:.6f}", flush=True)
        if mode == "stopped":
            os.kill(os.getpid(), signal.SIGSTOP)
        torch.cuda.synchronize()
        print(f"done {time.perf_counter() - t0:.6f}", flush=True)
        sys.stdin.readline()
    elif mode == "ipc":
        from cuda_l1.evaluate import cudadrv

        n = 64 << 20
        ptr = cudadrv.alloc(dev, n)
        view = cudadrv.tensor_at(dev, ptr, n)
        view.copy_(torch.arange(n, device=dev, dtype=torch.int64).remainder(251).to(torch.uint8))
        torch.cuda.synchronize()
        handle, offset = cudadrv.export_handle(ptr + 4096)
        t = torch.randn(1 << 20, device=dev)
        t0 = time.perf_counter()
        for _ in range(1000):
            cudadrv.export_handle(t.data_ptr())
        export_us = (time.perf_counter() - t0) * 1e6 / 1000
        print(json.dumps({"handle": handle, "offset": offset, "export_us": export_us}), flush=True)
        sys.stdin.readline()
    elif mode == "cpu_buffer":
        import numpy as np

        buf = np.arange(1 << 20, dtype=np.float32)
        print(json.dumps({"address": int(buf.ctypes.data), "nbytes": buf.nbytes}), flush=True)
        sys.stdin.readline()


def confined_cuda() -> None:
    """Enter namespaces, drop to nobody, then initialise CUDA (run as its own process)."""
    libc = ctypes.CDLL(None, use_errno=True)
    result = {}
    flags = 0x20000000 | 0x40000000 | 0x00020000  # NEWPID | NEWNET | NEWNS
    if libc.unshare(flags) != 0:
        print(json.dumps({"ok": False, "error": f"unshare: {os.strerror(ctypes.get_errno())}"}), flush=True)
        return
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        os._exit(0)
    try:
        MS_REC, MS_PRIVATE = 16384, 1 << 18
        libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
        result["mount_shm"] = libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"size=64m") == 0
        result["mount_proc"] = libc.mount(b"proc", b"/proc", b"proc", 0, None) == 0
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
        result["uid"] = os.getuid()
        import torch

        x = torch.randn(1024, 1024, device="cuda:0")
        result["matmul_sum_finite"] = bool(torch.isfinite((x @ x).sum()).item())
        result["ok"] = True
    except Exception as exc:
        result.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    print(json.dumps(result), flush=True)
    os._exit(0)


# -- parent side -------------------------------------------------------------------------------------
def _probe_once(torch, x) -> float:
    t0 = time.perf_counter()
    x.add_(1)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6


def _start(mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--worker", mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def contention(torch, x, mode: str, idle_us: float) -> dict:
    proc = _start(mode)
    line = proc.stdout.readline().split()
    t_launched = time.perf_counter()
    probes = []
    fast_in_a_row = 0
    while time.perf_counter() - t_launched < 5.0:
        us = _probe_once(torch, x)
        probes.append(us)
        fast_in_a_row = fast_in_a_row + 1 if us < 3 * idle_us + 20 else 0
        if fast_in_a_row >= 2:
            break
    waited_ms = (time.perf_counter() - t_launched) * 1e3
    if mode == "stopped":
        os.kill(proc.pid, signal.SIGCONT)
    done = proc.stdout.readline().split()
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(timeout=30)
    return {"mode": mode, "launch_s": float(line[1]), "work_done_s": float(done[1]), "probe_wait_ms": waited_ms,
            "probes": len(probes), "first_probes_us": [round(p, 1) for p in probes[:12]],
            "max_probe_us": round(max(probes), 1)}


def ipc(torch) -> dict:
    from cuda_l1.evaluate import cudadrv

    proc = _start("ipc")
    info = json.loads(proc.stdout.readline())
    t0 = time.perf_counter()
    base = cudadrv.open_handle("cuda:0", info["handle"])
    open_ms = (time.perf_counter() - t0) * 1e3
    view = cudadrv.tensor_at("cuda:0", base, 64 << 20)
    expect = torch.arange(64 << 20, device="cuda:0", dtype=torch.int64).remainder(251).to(torch.uint8)
    same = bool(torch.equal(view, expect))
    t0 = time.perf_counter()
    cudadrv.close_handle(base)
    close_ms = (time.perf_counter() - t0) * 1e3
    bad = None
    try:
        cudadrv.open_handle("cuda:0", "00" * 64)
    except cudadrv.CudaDriverError as exc:
        bad = str(exc)
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(timeout=30)
    return {"open_ms": open_ms, "close_ms": close_ms, "bytes_match": same, "offset_reported": info["offset"],
            "export_us_each": info["export_us"], "bogus_handle": bad}


def vm_read() -> dict:
    proc = _start("cpu_buffer")
    info = json.loads(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGSTOP)
    libc = ctypes.CDLL(None, use_errno=True)

    class Iov(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    buf = ctypes.create_string_buffer(info["nbytes"])
    local = Iov(ctypes.cast(buf, ctypes.c_void_p), info["nbytes"])
    remote = Iov(info["address"], info["nbytes"])
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    t0 = time.perf_counter()
    got = libc.process_vm_readv(proc.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    ms = (time.perf_counter() - t0) * 1e3
    import numpy as np

    values = np.frombuffer(buf.raw, dtype=np.float32)
    ok = got == info["nbytes"] and bool((values == np.arange(1 << 20, dtype=np.float32)).all())
    os.kill(proc.pid, signal.SIGCONT)
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(timeout=30)
    return {"ok": ok, "bytes": got, "ms": ms, "errno": ctypes.get_errno() if got < 0 else 0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", default=None)
    parser.add_argument("--confined", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.confined:
        return confined_cuda()
    report = {"facts": _facts()}
    report["vm_read"] = vm_read()
    import torch

    if torch.cuda.is_available():
        x = torch.zeros(1, device="cuda:0")
        for _ in range(50):
            _probe_once(torch, x)
        idle = [_probe_once(torch, x) for _ in range(300)]
        idle_med = statistics.median(idle)
        report["idle_probe_us"] = {"median": idle_med, "p90": statistics.quantiles(idle, n=10)[8], "max": max(idle)}
        report["contention"] = [contention(torch, x, m, idle_med) for m in ("big", "many", "stopped")]
        report["ipc"] = ipc(torch)
        out = subprocess.run([sys.executable, __file__, "--confined"], capture_output=True, text=True, timeout=120)
        report["confined_cuda"] = out.stdout.strip().splitlines()[-1:] or out.stderr[-2000:]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
