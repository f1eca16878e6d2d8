"""Fast, cached, policy-checked builds of `load_inline` extensions, run in trusted code.

    spec = ExtensionSpec.from_load_inline_args(*args, **kwargs)   # the candidate's call
    result = build_extension(spec)                                # or BuildPool().submit(spec)
    module = load_built(result)                                   # in the sandboxed child

See `compile.py` for the recipe and its measurements, `flags.py` for the flag policy. Names are
imported lazily, so the sandboxed child can import `loader` and `spec` without the rest.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BuildCache": "cache", "BuildResult": "cache", "build_extension": "cache",
    "RECIPE_VERSION": "compile", "build_key": "compile", "start_pch_builds": "compile",
    "BuildConfig": "build_config", "default_cache_dir": "build_config",
    "BuildError": "build_errors", "CompileError": "build_errors",
    "static_specs": "extract",
    "load_built": "loader", "load_built_path": "loader",
    "wait_for_background_pch": "pch",
    "BuildPool": "parallel",
    "compiler_runs": "procs",
    "ExtensionSpec": "spec",
    "Toolchain": "toolchain", "detect_toolchain": "toolchain",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
