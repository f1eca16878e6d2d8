"""A gcc precompiled header of <torch/extension.h>, one per toolchain and flag set.

gcc uses `X.h.gch` for `-include X.h` only when it was built with the same options (macros, -O,
-std, -fPIC ...), so the store keys each PCH by the exact compile flags of its users (minus the
per-module TORCH_EXTENSION_NAME define, which no torch header reads). Users compile with `-H`:
gcc then prints `! <path>.gch` when it loads the PCH, which is how `pch_used` knows it worked
(and `-Winvalid-pch` says why when it did not).

Measured (gcc 12, torch 2.13, CPU seconds on a 2-core EPYC; the binding TU of a two-tensor add):
building the PCH 37 s (786 MB file); the TU without it 17.9 s, with it 6.4 s. An empty TU with the
PCH still costs ~6 s: gcc instantiates the templates the headers use at the end of every TU, after
the point the PCH captures, so this is the floor for any TU that includes torch/extension.h.
(A lighter PCH of torch/types.h + pybind11 would save ~2.5 s more but change what cpp_sources see.)

With `pch="auto"` the first build of a flag set compiles without the PCH and starts building it
in a background thread at `nice 19`, so it takes only CPU that builds leave idle.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from cuda_l1.evaluate.build.procs import HEADER_FILE_BYTES, CommandResult, compiler_env, run_command
from cuda_l1.evaluate.build.toolchain import Toolchain

PCH_HEADER = "torch_extension_pch.h"
_HEADER_TEXT = "#include <torch/extension.h>\n"
_USED = re.compile(r"^! .*\.gch$", re.M)
# -H output: one line per opened header, then a list of header paths (never holding ':').
_H_TRACE = re.compile(r"^(\.+ |! )[^\n]*\n?|^Multiple include guards may be useful for:\n(?:[^\s:][^\n:]*\n)*",
                      re.M)

_background: list[threading.Thread] = []
_background_lock = threading.Lock()
_started: Counter = Counter()  # background header builds this process has started, by store directory
MAX_BACKGROUND_RUNNING = 2  # the two a build pool starts at once: the binding's and nvcc's host prefix
MAX_BACKGROUND_STARTED = 8  # a store's: both kinds of header for a few flag sets


def pch_used(output: str) -> bool:
    """True when the compiler output (with -H) shows the precompiled header was loaded."""
    return bool(_USED.search(output))


def strip_include_trace(output: str) -> str:
    """Drop the -H include tree from compiler output (keeps warnings and errors)."""
    return _H_TRACE.sub("", output)


class PchStore:
    """Precompiled headers under `<cache>/pch/<key>/`, each `<key>/<header_name>` beside its .gch."""

    def __init__(self, root: Path, header_name: str = PCH_HEADER):
        self.root = Path(root)
        self.header_name = header_name

    def key(self, toolchain: Toolchain, flags: Sequence[str]) -> str:
        material = {"cxx": toolchain.cxx, "cxx_version": toolchain.cxx_version,
                    "torch": toolchain.torch_version, "flags": list(flags)}
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]

    def header(self, key: str) -> Path:
        return self.root / key / self.header_name

    def ready(self, key: str) -> Path | None:
        """The header to `-include` when its .gch exists."""
        hdr = self.header(key)
        return hdr if hdr.with_name(self.header_name + ".gch").exists() else None

    def failed(self, key: str) -> bool:
        return (self.root / key / "failed").exists()

    def build(self, key: str, toolchain: Toolchain, flags: Sequence[str], timeout_s: float,
              blocking: bool = True) -> Path | None:
        """Build the PCH unless present; returns the header path, or None when it failed (or,
        non-blocking, when another builder holds the lock)."""
        def compile_header(kdir: Path, hdr: Path, tmp: Path, nice: list[str]) -> list[CommandResult]:
            hdr.write_text(_HEADER_TEXT)
            cmd = [*nice, toolchain.cxx, *flags, "-x", "c++-header", str(hdr), "-o", str(tmp)]
            return [run_command("pch", cmd, cwd=kdir, env=compiler_env(kdir), timeout_s=timeout_s,
                                label=f"pch:{key}", file_bytes=HEADER_FILE_BYTES)]

        return self.build_once(key, compile_header, blocking)

    def build_once(self, key: str, make: Callable[[Path, Path, Path, list[str]], list[CommandResult]],
                   blocking: bool) -> Path | None:
        """Run `make(key dir, header, temporary .gch, nice prefix)` under the key's lock unless the
        PCH is there or failed before; the .gch appears in one rename, so `ready` never sees half
        of one. A command that fails (not by timing out) leaves a "failed" marker: never again
        (a user of the PCH may leave one too)."""
        if self.failed(key):
            return None
        if self.ready(key):
            return self.header(key)
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{key}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                return None
            if self.failed(key):
                return None
            if self.ready(key):
                return self.header(key)
            kdir = self.root / key
            kdir.mkdir(exist_ok=True)
            hdr = self.header(key)
            tmp = kdir / f"tmp.{os.getpid()}.{threading.get_ident()}.gch"
            # In the background: only idle CPU, never a build's.
            nice = ["nice", "-n", "19"] if not blocking and shutil.which("nice") else []
            results = make(kdir, hdr, tmp, nice)
            (kdir / "pch.log").write_text("".join(
                f"$ {' '.join(r.cmd)}\n{r.output}\n[{r.name}: exit {r.returncode}, {r.wall_s:.1f}s wall, "
                f"{r.cpu_s:.1f}s cpu]\n" for r in results))
            if not results or not all(r.ok for r in results):
                tmp.unlink(missing_ok=True)
                if not any(r.timed_out or r.cancelled for r in results):
                    (kdir / "failed").write_text("".join(r.output for r in results)[-4000:])
                return None
            os.replace(tmp, hdr.with_name(self.header_name + ".gch"))
            return hdr

    def build_in_background(self, key: str, toolchain: Toolchain, flags: Sequence[str],
                            timeout_s: float) -> bool:
        """Start building the PCH in a daemon thread unless someone already is (False: not started,
        see `start_in_background`)."""
        return start_in_background(self.root, f"pch-{key[:8]}",
                                   lambda: self.build(key, toolchain, flags, timeout_s, blocking=False))


def start_in_background(store: Path, name: str, build: Callable[[], object], bounded: bool = True) -> bool:
    """Run `build` in a daemon thread that `wait_for_background_pch` waits for, unless
    MAX_BACKGROUND_RUNNING such builds run now or this process has started MAX_BACKGROUND_STARTED
    for the `store` directory (False then). Each is a compile of torch's headers (about 40 CPU
    seconds, 0.8 GB on disk, 2 GB of memory) that a candidate's flags can ask for: an adversarial
    reading started them with flags repeated or reordered, in parallel and without end. A header is
    an optimisation; the flag sets honest candidates share are the first to ask. `bounded=False`:
    the trusted pool's own default headers (compile.start_pch_builds), neither bounded nor counted."""
    def _run():
        try:
            build()
        except Exception:
            pass  # a PCH is an optimisation: losing it costs time, never correctness

    with _background_lock:
        _background[:] = [t for t in _background if t.is_alive()]
        if bounded:
            if len(_background) >= MAX_BACKGROUND_RUNNING or _started[str(store)] >= MAX_BACKGROUND_STARTED:
                return False
            _started[str(store)] += 1
        thread = threading.Thread(target=_run, name=name, daemon=True)
        _background.append(thread)
    thread.start()
    return True


def wait_for_background_pch(timeout_s: float | None = None) -> None:
    """Wait for PCH builds started in the background (before exit, or before timing warm builds)."""
    with _background_lock:
        threads = list(_background)
    for t in threads:
        t.join(timeout_s)
