"""torch.compile's modules imported once in the fork server, so that a torch.compile candidate's side
does not import them itself (4-5 s of each such side's load on an H200, 1-2 s on a 2-core CPU host).

Forking from a process that has initialised the CUDA driver breaks every forked side ("Cannot
re-initialize CUDA in forked subprocess"), and what an import does to the driver depends on torch's
version: on torch 2.11 with CUDA 13, `torch._dynamo` and `torch._inductor` leave the driver alone but
`torch._inductor.compile_fx` does not (benchmarks/fork_compiler_import.py, run on an H200). So the
server does not trust the list: after importing it checks that no thread was started and forks a
probe that asks torch whether it is in a bad fork. A preload that fails any check is reported, the
server exits, and its replacement starts without one (fork_server.ForkServer): slower, never weaker.

What the preload cannot carry over: anything the modules read from the environment at import. The
server's environment is a side's scrubbed one with the server's own scratch; inductor and Triton
read their cache directories when they compile, not at import (the import only makes an empty one in
the server's scratch), so a side still compiles into its own (tests/test_fork_preload.py checks it).
"""

from __future__ import annotations

import importlib
import os
import threading

# What torch.compile's first call imports, as far as forked sides can still use CUDA afterwards.
COMPILER_MODULES = ("torch._dynamo", "torch._inductor")
PROBE_BAD_FORK = 3  # the probe's exit status when torch says it is in a bad fork


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def preload(modules: tuple[str, ...]) -> str:
    """Import `modules`, then check that forking is still safe. Returns "" when it is, else why not
    (the caller must then not fork: what was imported cannot be taken back)."""
    threads_before = os_threads()
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a broken optional install: the sides import it themselves
            return f"importing {name} failed: {type(exc).__name__}: {exc}"[:500]
    if threading.active_count() != 1:
        return f"importing {', '.join(modules)} started a Python thread"
    if os_threads() > threads_before:
        return f"importing {', '.join(modules)} started {os_threads() - threads_before} native thread(s)"
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
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == PROBE_BAD_FORK:
        return "the imports initialised CUDA: a forked side could not use the device"
    return "" if code == 0 else f"the fork probe failed (exit status {code})"
