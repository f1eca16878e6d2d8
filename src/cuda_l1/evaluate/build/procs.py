"""Running compiler commands: in parallel, with a time limit, measuring wall and CPU seconds.

Commands are argv lists, never shell text (the one exception: `nvcc_split` replays the lines
`nvcc --dryrun` prints, as nvcc itself does; `flags` keeps shell syntax out of nvcc flags).
Each runs in its own session so a time-out kills the whole compiler pipeline (nvcc forks
cudafe++, cicc, ptxas, gcc). CPU time comes from `wait4`, so a figure stays comparable on a
loaded machine.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_runs: Counter = Counter()
_runs_lock = threading.Lock()
# Process groups of the commands running now, and those stopped by `cancel_running` (an interrupted
# owner): a cancelled command says so, so that nothing caches or marks it as a failure.
_live: set[int] = set()
_cancelled: set[int] = set()

# The only variables compilers get: nothing that injects flags (NVCC_APPEND_FLAGS, CPATH, ...) and
# changes the output behind the cache key's back, and no credentials of the trusted process.
_KEPT_ENV = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "HOME", "USER", "LOGNAME")


# Directories every confined compiler may read besides the system and toolchain ones: the build
# caches this process uses (precompiled headers live there). See jail.py.
_jail_reads: set[str] = set()


# What one compiler process may write to one file and hold in address space (jail.py sets them as
# rlimits before the exec). A candidate's source decides what its compilers do: an initialised array
# of a GiB became two 1 GiB libraries in the cache, and a template bomb took a compiler past 1 GB
# and growing. Honest extensions write a few MB a file; torch's precompiled headers 0.8 GB.
FILE_BYTES = 512 << 20
HEADER_FILE_BYTES = 4 << 30
MEMORY_BYTES = 8 << 30
# What is kept of a command's output: its first and last part (compiler messages that matter are at
# either end). An adversarial source made gcc print 668 MB of errors, all of it read into the
# trusted process and copied several times over (2.8 GB).
OUTPUT_HEAD_BYTES = 1 << 20
OUTPUT_TAIL_BYTES = 256 << 10


def allow_reads(path: str | os.PathLike) -> None:
    """Let confined compilers read below `path` (the build cache)."""
    _jail_reads.add(str(path))


def jailed(cmd: Sequence[str], cwd: Path, env: dict, file_bytes: int = FILE_BYTES) -> list[str]:
    """`cmd` behind the jail launcher: writes only in its own directory (and its TMPDIR), files of
    at most `file_bytes`, an address space of at most MEMORY_BYTES."""
    import sys

    writes = [str(cwd)] + ([env["TMPDIR"]] if env.get("TMPDIR") else [])
    # The launcher by path: compilers get a scrubbed environment, and this package may be importable
    # only through the caller's PYTHONPATH.
    root = str(Path(__file__).resolve().parents[3])  # the directory holding the cuda_l1 package
    # -I: neither the working directory (the build directory, which compilers write) nor user site
    # directories nor PYTHON* variables reach the launcher's imports.
    launcher = [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {root!r}); "
                "from cuda_l1.evaluate.build.jail import main; main()"]
    for w in writes:
        launcher += ["--write", w]
    for r in sorted(_jail_reads):
        launcher += ["--read", r]
    launcher += ["--max-file-bytes", str(file_bytes), "--max-memory-bytes", str(MEMORY_BYTES)]
    return launcher + ["--"] + list(cmd)


def compiler_runs(label: str) -> int:
    """How many commands ran under `label` (a build key, or "pch:<key>") in this process."""
    with _runs_lock:
        return _runs[label]


def compiler_env(tmpdir: Path) -> dict[str, str]:
    """The environment compilers run with: a few of ours, C locale, and a private TMPDIR so nvcc's
    intermediates of parallel builds never meet."""
    env = {k: v for k, v in os.environ.items() if k in _KEPT_ENV}
    env["LC_ALL"] = "C"
    env["TMPDIR"] = str(tmpdir)
    return env


@dataclass
class CommandResult:
    """How one command went."""

    name: str  # step name: cpp, cuda, link, pch
    cmd: list[str]  # argv as run
    returncode: int  # exit status (-signal when killed)
    wall_s: float  # elapsed seconds
    cpu_s: float  # user + system seconds of the command and its children
    output: str  # stdout and stderr together
    timed_out: bool  # killed for running past the limit
    cancelled: bool = False  # killed because its owner stopped (cancel_running): says nothing of the code

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.cancelled


def run_command(name: str, cmd: Sequence[str], *, cwd: Path, env: dict, timeout_s: float,
                label: str, file_bytes: int = FILE_BYTES) -> CommandResult:
    """Run one command to completion (or until `timeout_s`), output captured through a file (its
    first and last part kept: `bounded_output`)."""
    with _runs_lock:
        _runs[label] += 1
    out_path = Path(cwd) / f".{name}.out"
    start = time.perf_counter()
    with open(out_path, "wb") as out, _runs_lock:  # registered before cancel_running can look
        proc = subprocess.Popen(jailed(cmd, Path(cwd), env, file_bytes), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        _live.add(proc.pid)
    timed_out = threading.Event()

    def _kill():
        timed_out.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout_s, _kill)
    timer.daemon = True
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
        with _runs_lock:
            _live.discard(proc.pid)
            cancelled = proc.pid in _cancelled
            _cancelled.discard(proc.pid)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen consistent
    wall = time.perf_counter() - start
    output = bounded_output(out_path)
    out_path.unlink(missing_ok=True)
    return CommandResult(name, list(cmd), proc.returncode, wall, usage.ru_utime + usage.ru_stime,
                         output, timed_out.is_set(), cancelled)


def bounded_output(path: Path, head: int = OUTPUT_HEAD_BYTES, tail: int = OUTPUT_TAIL_BYTES) -> str:
    """A command's output file as text: all of it if short, else its first `head` and last `tail`
    bytes with a line saying how much was left out (never the whole of a flood in memory)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= head + tail:
            return f.read().decode(errors="replace")
        first = f.read(head)
        f.seek(size - tail)
        last = f.read(tail)
    note = f"\n[... {size - head - tail} bytes of compiler output left out ...]\n"
    return first.decode(errors="replace") + note + last.decode(errors="replace")


def cancel_running() -> int:
    """Kill every compiler command this process runs now (its owner was interrupted); returns how many.
    Their results say `cancelled`, so nothing is cached or marked failed because of it."""
    with _runs_lock:
        pids = list(_live)
        _cancelled.update(pids)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


# A compiler runs in a session of its own (so a time-out kills its whole pipeline), so nothing kills
# it with this process: one still running at exit (a header built in the background for a command
# that has finished) would run on as an orphan, using cores and memory no one accounts for.
atexit.register(cancel_running)


def in_parallel(calls: dict) -> dict:
    """Run zero-argument callables in threads (each waits on its own processes); results by name."""
    results: dict = {}
    errors: list[BaseException] = []

    def _one(name, fn):
        try:
            results[name] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=_one, args=item, daemon=True) for item in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
