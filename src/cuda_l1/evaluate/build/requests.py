"""The parent's answer to a child's `load_inline` call: build in trusted code, reply with a path.

The arguments arrive from untrusted code, so they are validated (the build layer's flag and source
policy), compiled with a scrubbed environment, and cached by content; the child only ever gets the
path of a library to import, in a cache it can read but not write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from cuda_l1.evaluate.config import EvalConfig


def build_cache_dir(config: EvalConfig) -> Path:
    """The build cache, created if missing: a child's filesystem rules can only name a directory that
    exists when it confines itself, so on a fresh machine the first build would land somewhere the
    child may not read."""
    from cuda_l1.evaluate.build import default_cache_dir

    path = Path(config.build_cache_dir).expanduser() if config.build_cache_dir else default_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_builder(config: EvalConfig) -> Callable[..., dict]:
    def build(request: dict, timeout_s: float | None = None) -> dict:
        """Answer one load_inline request; `timeout_s` bounds each compiler command (the time the
        candidate has left), so a source that compiles forever cannot outlast its evaluation."""
        try:
            from cuda_l1.evaluate.build import BuildConfig, BuildError, ExtensionSpec, build_extension
        except ImportError as exc:  # pragma: no cover - build layer missing from the install
            return {"ok": False, "log": f"extension builds are not available: {exc}"}
        args, kwargs = request.get("args") or [], request.get("kwargs") or {}
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return {"ok": False, "log": "malformed load_inline arguments"}
        try:
            spec = ExtensionSpec.from_load_inline_args(*args, **kwargs)
            limit = BuildConfig().timeout_s if timeout_s is None else max(1.0, min(BuildConfig().timeout_s, timeout_s))
            result = build_extension(spec, BuildConfig(cache_dir=build_cache_dir(config), timeout_s=limit))
        except BuildError as exc:
            return {"ok": False, "log": str(exc)}
        except Exception as exc:  # a builder bug must not take the evaluator down with it
            return {"ok": False, "log": f"{type(exc).__name__}: {exc}"}
        if not result.ok:
            return {"ok": False, "log": result.error}
        return {"ok": True, "so_path": result.so_path, "module_name": result.module_name,
                "is_python_module": result.is_python_module, "cached": result.cached,
                "build_s": result.timings.get("total_s")}

    return build
