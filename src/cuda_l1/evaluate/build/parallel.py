"""`BuildPool`: build many extensions at once on the CPU cores, ahead of the GPU queue.

Each build runs its compilers as child processes (the binding TU and the CUDA TU in parallel, so
about two busy cores per build); the pool's threads only wait on them, so `max_workers` defaults
to half the cores. Submitting a spec whose key is already in flight returns the same future, and
the cache's file lock extends that to other processes. A new pool starts building the precompiled
headers that candidates with default flags use (`compile.start_pch_builds`), so the first build finds
them ready; `shutdown` waits for those builds, so no compiler outlives the pool.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from cuda_l1.evaluate.build.cache import BuildResult, build_extension
from cuda_l1.evaluate.build.compile import build_key, start_pch_builds
from cuda_l1.evaluate.build.build_config import BuildConfig
from cuda_l1.evaluate.build.pch import wait_for_background_pch
from cuda_l1.evaluate.build.spec import ExtensionSpec
from cuda_l1.evaluate.build.toolchain import detect_toolchain


class BuildPool:
    """A bounded set of concurrent builds with in-flight de-duplication."""

    def __init__(self, config: BuildConfig | None = None, max_workers: int | None = None,
                 start_pch: bool = True):
        self.config = config or BuildConfig()
        self.toolchain = detect_toolchain(self.config.arch)
        if start_pch:
            start_pch_builds(self.config, self.toolchain)
        workers = max_workers or max(1, (os.cpu_count() or 2) // 2)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="build")
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()

    def key(self, spec: ExtensionSpec) -> str:
        return build_key(spec, self.toolchain, self.config)

    def submit(self, spec: ExtensionSpec) -> Future:
        """A future of the `BuildResult`; the same future for a key already being built."""
        key = self.key(spec)
        with self._lock:
            fut = self._inflight.get(key)
            if fut is not None:
                return fut
            fut = self._executor.submit(build_extension, spec, self.config, self.toolchain)
            self._inflight[key] = fut
        fut.add_done_callback(lambda _f, k=key: self._forget(k))
        return fut

    def _forget(self, key: str) -> None:
        with self._lock:
            self._inflight.pop(key, None)

    def build(self, spec: ExtensionSpec) -> BuildResult:
        return self.submit(spec).result()

    def shutdown(self, wait: bool = True, cancel_pending: bool = False) -> None:
        """Stop taking builds; `cancel_pending` drops those not started yet (their futures are cancelled)."""
        self._executor.shutdown(wait=wait, cancel_futures=cancel_pending)
        if wait:
            wait_for_background_pch()

    def __enter__(self) -> BuildPool:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
