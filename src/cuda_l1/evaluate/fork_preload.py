"""torch.compile's modules imported once in the fork server, so that a torch.compile candidate's side
does not import them itself (4-5 s of each such side's load on an H200, 1-2 s on a 2-core CPU host).

Forking from a process that has initialised the CUDA driver breaks every forked side ("Cannot
re-initialize CUDA in forked subprocess"), and what an import does to the driver depends on torch's
version: on torch 2.11 with CUDA 13, `torch._dynamo` and `torch._inductor` leave the driver alone but
`torch._inductor.compile_fx` does not (benchmarks/fork_compiler_import.py, run on an H200). So the
server does not trust the list. After importing it refuses the preload when a thread appeared (by
id: a count can hide one that a fork-aware pool gave up), when the process holds a descriptor of
an NVIDIA device or has newly mapped the driver library (what initialising the driver does,
whoever did it), or when a forked probe finds torch in a bad fork. A refused preload is reported,
the server exits, and its replacement starts without one (fork_server.ForkServer): slower, never
weaker. A server that dies or hangs while preloading counts as refused too.

What the preload cannot carry over is what the modules read from the environment or the working
directory at import. The server's environment is a side's scrubbed one with the server's own
scratch. Inductor and Triton read their cache directories when they compile, not at import (the
import only makes an empty one in the server's scratch), so a side compiles into its own
(tests/test_fork_preload.py checks it). Dynamo's debug directory is fixed at import from the working
directory: `into_side` points it at the side's own after the fork, as a fresh import would.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time

# What torch.compile's first call imports, as far as forked sides can still use CUDA afterwards.
COMPILER_MODULES = ("torch._dynamo", "torch._inductor")
PROBE_BAD_FORK = 3  # the probe's exit status when torch says it is in a bad fork
PROBE_TIMEOUT_S = 30.0


def thread_ids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def driver_traces() -> set[str]:
    """NVIDIA device descriptors held and driver libraries mapped: what initialising CUDA leaves."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            found.add(target)
    try:
        with open("/proc/self/maps") as maps:
            found |= {line.split()[-1] for line in maps if "libcuda.so" in line}
    except OSError:
        pass
    return found


def preload(modules: tuple[str, ...]) -> str:
    """Import `modules`, then check that forking is still safe. Returns "" when it is, else why not
    (the caller must then not fork: what was imported cannot be taken back)."""
    threads, traces = thread_ids(), driver_traces()
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a broken optional install: the sides import it themselves
            return f"importing {name} failed: {type(exc).__name__}: {exc}"[:500]
    what = ", ".join(modules)
    if threading.active_count() != 1 or thread_ids() - threads:
        return f"importing {what} started a thread"
    if driver_traces() - traces:
        return f"importing {what} initialised the CUDA driver ({', '.join(sorted(driver_traces() - traces))[:300]})"
    return _probe_fork()


def _probe_fork() -> str:
    """Fork a child that asks torch whether CUDA would refuse it; "" when it would not."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            code = PROBE_BAD_FORK if torch.cuda._is_in_bad_fork() else 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"the fork probe did not answer within {PROBE_TIMEOUT_S:.0f} s"
        time.sleep(0.01)
    code = os.waitstatus_to_exitcode(status)
    if code == PROBE_BAD_FORK:
        return "the imports initialised CUDA: a forked side could not use the device"
    return "" if code == 0 else f"the fork probe failed (exit status {code})"


def into_side() -> None:
    """In a forked side, after it has moved into its own directory and environment: what the preload
    fixed from the server's (Dynamo's debug directory) worked out again, as its own import would."""
    config = sys.modules.get("torch._dynamo.config")
    if config is not None and hasattr(config, "default_debug_dir_root"):
        config.debug_dir_root = config.default_debug_dir_root()
