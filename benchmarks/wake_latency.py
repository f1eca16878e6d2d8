"""How long a ring takes to be seen (a script, not a test): a child on core 0 waits for a go word, works
W us, writes a ring word and wakes a futex on it; the parent on core 1 either polls the word or sleeps
on the futex. Prints the round trip less W: what the doorbell adds to a call (gating.Gate._wait).

    python benchmarks/wake_latency.py --work 0 5 20 50 100 200 400 1000 3000
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import time

_SYS_FUTEX = 202  # x86-64


def measure(work_s: float, mode: str, rounds: int) -> list[float]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = os.memfd_create("wake-latency")
    os.ftruncate(fd, 4096)
    page = mmap.mmap(fd, 4096)
    words = (ctypes.c_uint32 * 2).from_buffer(page)
    at = ctypes.c_void_p(ctypes.addressof(words))
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {0})
        for i in range(1, rounds + 1):
            while words[1] != i:
                pass
            t = time.perf_counter()
            while time.perf_counter() - t < work_s:
                pass
            words[0] = i
            libc.syscall(_SYS_FUTEX, at, 1, 1, None, None, 0)  # FUTEX_WAKE
        os._exit(0)
    os.sched_setaffinity(0, {1})

    class Timespec(ctypes.Structure):
        _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]

    nap, out = Timespec(0, 20_000_000), []
    for i in range(1, rounds + 1):
        t0 = time.perf_counter()
        words[1] = i
        while words[0] != i:
            if mode == "futex":
                libc.syscall(_SYS_FUTEX, at, 0, words[0], ctypes.byref(nap), None, 0)  # FUTEX_WAIT
        out.append(time.perf_counter() - t0 - work_s)
    os.waitpid(pid, 0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=float, nargs="+", default=[0, 5, 20, 50, 100, 200, 400, 1000, 3000], help="us")
    parser.add_argument("--rounds", type=int, default=1000)
    args = parser.parse_args()
    for work in args.work:
        for mode in ("futex", "poll"):
            lat = sorted(measure(work * 1e-6, mode, args.rounds if work < 1000 else args.rounds // 5))
            print(f"{mode:5s} work {work:6.0f} us: added median {statistics.median(lat) * 1e6:6.1f} us, "
                  f"p10 {lat[len(lat) // 10] * 1e6:6.1f}, p90 {lat[len(lat) * 9 // 10] * 1e6:6.1f}")


if __name__ == "__main__":
    main()
