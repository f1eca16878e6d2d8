"""Import a built extension: the only part of the build layer that runs in the sandboxed child.

Deliberately self-contained (stdlib and torch only): the child imports this file and nothing else
of the build package. `result` may be a `BuildResult` or any object/dict with `ok`, `so_path`,
`module_name`, `is_python_module` and `error`.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys


def _field(result, name, default=None):
    if isinstance(result, dict):
        return result.get(name, default)
    return getattr(result, name, default)


def load_built_path(so_path: str, module_name: str, is_python_module: bool = True, *,
                    register: bool = False):
    """`load_built` for a bare path and module name (what the parent sends the child)."""
    return load_built({"ok": True, "so_path": so_path, "module_name": module_name,
                       "is_python_module": is_python_module}, register=register)


def load_built(result, *, register: bool = False):
    """Load the library of a successful build and return the module (or, for
    `is_python_module=False`, the library path after loading its torch ops, as load_inline does).

    The module is not put in `sys.modules` unless `register` is true, so two candidates that chose
    the same module name never see each other's module.
    """
    if not _field(result, "ok", True) or not _field(result, "so_path"):
        raise ImportError(f"extension was not built: {_field(result, 'error', '') or 'no library'}")
    path = str(_field(result, "so_path"))
    if not _field(result, "is_python_module", True):
        import torch

        torch.ops.load_library(path)
        return path
    name = str(_field(result, "module_name"))
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        raise ImportError(f"cannot import {name} from {path}")
    import torch  # noqa: F401  (the extension links against libtorch, loaded by importing torch)

    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    if register:
        sys.modules[name] = module
    return module
