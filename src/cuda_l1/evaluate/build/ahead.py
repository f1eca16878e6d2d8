"""`Prebuilder`: compile queued candidates' extensions on the CPU cores before a GPU worker takes them.

    prebuilder = Prebuilder(config)
    futures = prebuilder.submit(candidate_source)   # [] when nothing is knowable ahead
    ... dispatch the candidate once every future is done ...

The specs come from the candidate's source read statically (build/extract.py), never from running
it; the builds are the trusted build layer's, into the same content-addressed cache the evaluator's
builder uses, so when the sandboxed child later asks for its extension, the answer is a cache hit.
A pool that dispatches only candidates whose builds are done keeps its GPUs off the compilers'
critical path whenever other work is queued.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

from cuda_l1.evaluate.build.requests import build_cache_dir
from cuda_l1.evaluate.config import EvalConfig


class Prebuilder:
    """Static spec extraction plus a lazily started `BuildPool` sharing the evaluator's cache."""

    def __init__(self, config: EvalConfig, max_workers: int | None = None):
        self.cache_dir = build_cache_dir(config)
        self.max_workers = max_workers
        self._pool = None
        self._lock = threading.Lock()
        self.stats = {"candidates": 0, "extensions": 0, "skipped": 0}  # skipped: extraction or pool errors
        # The pool starts on the first candidate; its precompiled headers start now, so that candidate
        # finds them ready.
        from cuda_l1.evaluate.build import BuildConfig
        from cuda_l1.evaluate.build.compile import start_pch_builds

        start_pch_builds(BuildConfig(cache_dir=self.cache_dir))

    def _build_pool(self):
        with self._lock:
            if self._pool is None:
                from cuda_l1.evaluate.build import BuildConfig, BuildPool

                self._pool = BuildPool(BuildConfig(cache_dir=self.cache_dir), max_workers=self.max_workers,
                                       start_pch=False)  # started in __init__
            return self._pool

    def submit(self, source: str) -> list[Future]:
        """Start building what `source` will ask for; the futures resolve to `BuildResult`s."""
        try:
            from cuda_l1.evaluate.build import static_specs

            specs = static_specs(source)
            if not specs:
                return []
            pool = self._build_pool()
            futures = [pool.submit(spec) for spec in specs]
        except Exception:  # a prebuild is an optimisation: the child's own request still builds
            self.stats["skipped"] += 1
            return []
        self.stats["candidates"] += 1
        self.stats["extensions"] += len(futures)
        return futures

    def close(self, cancel: bool = False) -> None:
        """Drop queued builds and wait for running ones and the precompiled headers' (so no compiler
        outlives the pool); `cancel` (an interrupted owner): kill them instead of waiting, nothing of
        them cached or marked failed."""
        from cuda_l1.evaluate.build import wait_for_background_pch
        from cuda_l1.evaluate.build.procs import cancel_running

        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=not cancel, cancel_pending=True)
        if cancel:
            cancel_running()
        wait_for_background_pch()
