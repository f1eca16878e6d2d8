"""The parent's answer to a child's `load_inline` call: build in trusted code, reply with a path.

The spec arrives from untrusted code, so it is validated (flag policy) by the build layer, compiled with
a scrubbed environment, and cached by content; the child only ever gets a path to import.
"""

from __future__ import annotations

from typing import Callable

from cuda_l1.evaluate.config import EvalConfig


def default_builder(config: EvalConfig) -> Callable[[dict], dict]:
    def build(spec_dict) -> dict:
        try:
            from cuda_l1.evaluate.build import BuildError, ExtensionSpec, build_extension
        except ImportError as exc:  # pragma: no cover - build layer missing from the install
            return {"ok": False, "log": f"extension builds are not available: {exc}"}
        try:
            spec = ExtensionSpec.from_dict(spec_dict)
            result = build_extension(spec, cache_dir=config.build_cache_dir, device=config.device)
        except BuildError as exc:
            return {"ok": False, "log": str(exc)}
        except Exception as exc:  # a builder bug must not take the evaluator down with it
            return {"ok": False, "log": f"{type(exc).__name__}: {exc}"}
        if not result.ok:
            return {"ok": False, "log": result.log}
        return {"ok": True, "path": str(result.so_path), "module": result.module_name}

    return build
