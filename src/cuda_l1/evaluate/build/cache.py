"""The content-addressed build cache, and `build_extension`, the one call that uses it.

Layout: `<cache_dir>/<key>/` holds `<module>.so` (absent for a failed build), `build.log`,
`meta.json` (spec summary, timings, toolchain, error), and the generated `main.cpp`/`cuda.cu`.
A build runs in `<cache_dir>/tmp/<key>.<random>/` and is published with one `rename`, so readers
see a whole entry or none. Builders of the same key (threads or processes) serialise on an
`fcntl.flock` of `<cache_dir>/locks/<key>.lock` and re-check the cache after getting it, so a
source is compiled once. Published entries are made readable by everyone (directories 0755, files
at least 0644) whatever the builder's umask: a sandboxed child may see the files through a user
namespace in which their owner is not its own user, and a private 0700 build directory (what
`mkdtemp` makes) would then fail to load with "Permission denied". Compile errors are published like successes (the same error comes back
without compiling again); time-outs, kills and out-of-memory failures are not, since they say more
about the machine than about the source.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from cuda_l1.evaluate.build.compile import build_key, compile_extension
from cuda_l1.evaluate.build import cache_limits
from cuda_l1.evaluate.build.build_config import BuildConfig
from cuda_l1.evaluate.build.build_errors import CompileError
from cuda_l1.evaluate.build.host_pch import HostPchStore
from cuda_l1.evaluate.build.pch import PchStore
from cuda_l1.evaluate.build.spec import ExtensionSpec
from cuda_l1.evaluate.build.toolchain import Toolchain, detect_toolchain
from cuda_l1.evaluate.build.procs import allow_reads


@dataclass(frozen=True)
class BuildResult:
    """The outcome of building one spec; what `load_built` needs to import it."""

    key: str  # content hash of spec + toolchain + recipe
    ok: bool  # a library was built
    module_name: str  # name the library must be imported under
    so_path: str | None  # absolute path of the library (None when not ok)
    error: str  # trimmed compiler output when not ok
    cached: bool  # served from the cache without compiling in this call
    is_python_module: bool  # import as a module (True) or load as a library of torch ops
    entry_dir: str | None  # the cache entry (None for an unpublished time-out)
    timings: dict = field(default_factory=dict)  # per step: wall_s, cpu_s; total_s; lookup_s
    notes: dict = field(default_factory=dict)  # pch / cuda_headers decisions

    @property
    def log(self) -> str:
        """The compiler messages worth showing (same as `error`)."""
        return self.error

    def raise_for_error(self) -> None:
        if not self.ok:
            raise CompileError(f"extension build failed:\n{self.error}", key=self.key, log=self.error)


STALE_WORKDIR_S = 24 * 3600  # a build directory this old was left by a killed builder: remove it


def _make_dir(path: Path) -> Path:
    """mkdir -p; the directory itself, when made here, gets 0755 (not what the umask says)."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(path, 0o755)
    return path


def make_readable(root: Path) -> None:
    """Directories 0755; files gain read for everyone (and execute where the owner has it)."""
    for directory, _, files in os.walk(root):
        with contextlib.suppress(OSError):
            os.chmod(directory, 0o755)
        for name in files:
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                mode = os.stat(path).st_mode & 0o777
                os.chmod(path, mode | 0o444 | (0o111 if mode & 0o100 else 0))


class BuildCache:
    """A directory of published builds."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def entry(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str) -> dict | None:
        """The entry's meta.json, when the key was built (successfully or not) and is intact."""
        try:
            meta = json.loads((self.entry(key) / "meta.json").read_text())
        except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
            return None
        if meta.get("ok") and not (self.entry(key) / str(meta.get("library"))).is_file():
            return None  # library removed by hand: build again
        cache_limits.mark_used(self.entry(key))
        return meta

    def discard(self, key: str) -> None:
        """Remove a damaged entry (call with the key's lock held)."""
        if self.entry(key).exists():
            shutil.rmtree(self.entry(key), ignore_errors=True)

    @contextlib.contextmanager
    def lock(self, key: str):
        """Exclusive per-key lock across threads and processes (flock on a per-call open)."""
        locks = _make_dir(self.root / "locks")
        with open(locks / f"{key}.lock", "a") as fh:  # "a": never truncate a file another process holds
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def new_workdir(self, key: str) -> Path:
        tmp = _make_dir(self.root / "tmp")
        self._sweep(tmp)
        return Path(tempfile.mkdtemp(prefix=f"{key[:16]}.", dir=tmp))

    @staticmethod
    def _sweep(tmp: Path) -> None:
        """Remove build directories of builders killed long ago (a live build is minutes old at most)."""
        now = time.time()
        with contextlib.suppress(OSError):
            for old in tmp.iterdir():
                with contextlib.suppress(OSError):
                    if now - old.stat().st_mtime > STALE_WORKDIR_S:
                        shutil.rmtree(old, ignore_errors=True)

    def publish(self, key: str, workdir: Path, meta: dict, log: str) -> Path:
        """Write meta.json and build.log, then move the directory into place atomically."""
        (workdir / "build.log").write_text(log)
        (workdir / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        make_readable(workdir)  # before the rename: once published, other processes may load it at once
        target = self.entry(key)
        try:
            os.rename(workdir, target)
        except OSError:  # someone published meanwhile (only possible without the lock)
            shutil.rmtree(workdir, ignore_errors=True)
        return target


def _result(key: str, meta: dict, entry: Path | None, cached: bool, lookup_s: float) -> BuildResult:
    so = str(entry / meta["library"]) if meta.get("ok") and entry is not None else None
    timings = dict(meta.get("timings", {}))
    timings["lookup_s"] = round(lookup_s, 4)
    return BuildResult(key=key, ok=bool(meta.get("ok")), module_name=meta["module_name"], so_path=so,
                       error=meta.get("error", ""), cached=cached,
                       is_python_module=bool(meta.get("is_python_module", True)),
                       entry_dir=str(entry) if entry is not None else None, timings=timings,
                       notes=dict(meta.get("notes", {})))


def build_extension(spec: ExtensionSpec, config: BuildConfig | None = None,
                    toolchain: Toolchain | None = None, *, cache_dir: str | os.PathLike | None = None,
                    device: str | None = None) -> BuildResult:
    """Return the built library for `spec`, compiling it only if no one has before.

    `cache_dir` overrides `config.cache_dir`. `device` is accepted for callers that know where the
    extension will run; it changes nothing, since CUDA code is built for every local GPU
    architecture (see `toolchain.resolve_arches`) and so runs on any of them.
    """
    config = config or BuildConfig()
    allow_reads(Path(cache_dir).expanduser() if cache_dir else config.resolved_cache_dir())
    if cache_dir is not None:
        config = dataclasses.replace(config, cache_dir=cache_dir)
    toolchain = toolchain or detect_toolchain(config.arch)
    start = time.perf_counter()
    key = build_key(spec, toolchain, config)
    cache = BuildCache(_make_dir(Path(config.resolved_cache_dir())))
    meta = cache.lookup(key)
    if meta is not None:
        return _result(key, meta, cache.entry(key), True, time.perf_counter() - start)
    with cache.lock(key):
        meta = cache.lookup(key)
        if meta is not None:  # built by whoever held the lock before us
            return _result(key, meta, cache.entry(key), True, time.perf_counter() - start)
        cache.discard(key)  # whatever is left is not a usable entry
        workdir = cache.new_workdir(key)
        pch = None if config.pch == "off" else PchStore(cache.root / "pch")
        host_pch = None if config.pch == "off" else HostPchStore(cache.root / "pch")
        try:
            outcome = compile_extension(spec, toolchain, key, workdir, config, pch, host_pch)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        outcome.timings["total_s"] = round(time.perf_counter() - start, 3)
        meta = {"key": key, "ok": outcome.ok, "module_name": outcome.module_name,
                "library": outcome.library, "error": outcome.error,
                "is_python_module": spec.is_python_module, "spec": spec.summary(),
                "timings": outcome.timings, "notes": outcome.notes,
                "toolchain": {"cxx": toolchain.cxx_version, "nvcc": toolchain.nvcc_version,
                              "torch": toolchain.torch_version, "torch_cuda": toolchain.torch_cuda,
                              "arches": list(toolchain.arches)},
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        if outcome.transient or (not outcome.ok and not config.cache_failures):
            shutil.rmtree(workdir, ignore_errors=True)
            return _result(key, meta, None, False, 0.0)
        size = cache_limits.tree_bytes(workdir)
        oversized = cache_limits.too_large(size, config.max_entry_bytes)
        if oversized:  # kept as a failed build: its error, none of its files
            shutil.rmtree(workdir, ignore_errors=True)
            workdir = cache.new_workdir(key)
            meta.update(ok=False, library=None, error=oversized)
            size = 0
        meta["bytes"] = size + len(outcome.log) + 4096  # about: with build.log and meta.json
        entry = cache.publish(key, workdir, meta, outcome.log)
        with contextlib.suppress(OSError):  # the bookkeeping never fails a build that is published
            cache_limits.note_published(cache.root, meta["bytes"], config.cache_max_bytes, keep=key)
        return _result(key, meta, entry, False, 0.0)
