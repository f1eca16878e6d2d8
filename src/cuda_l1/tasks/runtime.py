"""Running a task's module-level code: build its module, its inputs and its model (never `forward`).

Used by the trusted side of the evaluator and by `tasks show`. The child harness has its own
minimal copy of module loading so that it does not import this package's trusted code paths.
"""

from __future__ import annotations

import linecache
import numbers
import sys
import types
from typing import Any

from cuda_l1.errors import TaskError
from cuda_l1.tasks.task import Task


def load_module(source: str, module_name: str, filename: str) -> types.ModuleType:
    """Execute a source as a fresh module. Its lines are registered so tracebacks and inspect work."""
    module = types.ModuleType(module_name)
    module.__file__ = filename
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source, filename, "exec")
    sys.modules[module_name] = module  # dataclasses, pickling and torch.compile look modules up here
    exec(code, module.__dict__)
    return module


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (numbers.Number, bool, str))


def check_forward_args(values: Any, origin: str) -> list:
    """get_inputs() must return a list (or tuple) of tensors and scalars."""
    import torch

    if not isinstance(values, (list, tuple)):
        raise TaskError(
            f"get_inputs() returned {type(values).__name__}; it must return a list of tensors and scalars "
            "(the arguments of Model.forward).",
            path=origin,
        )
    for index, value in enumerate(values):
        if not (isinstance(value, torch.Tensor) or _is_scalar(value)):
            raise TaskError(
                f"get_inputs()[{index}] is a {type(value).__name__}; forward arguments must be tensors or "
                "scalars (int, float, bool).",
                path=origin,
            )
    return list(values)


def check_init_args(values: Any, origin: str) -> list:
    """get_init_inputs() returns constructor arguments: scalars, strings, or tuples/lists of those."""
    import torch

    if not isinstance(values, (list, tuple)):
        raise TaskError(
            f"get_init_inputs() returned {type(values).__name__}; it must return a list of constructor "
            "arguments (possibly empty).",
            path=origin,
        )
    for index, value in enumerate(values):
        ok = _is_scalar(value) or isinstance(value, torch.Tensor)
        if isinstance(value, (list, tuple)):
            ok = all(_is_scalar(v) for v in value)
        if not ok:
            raise TaskError(
                f"get_init_inputs()[{index}] is a {type(value).__name__}; constructor arguments must be "
                "scalars, strings or tuples of them.",
                path=origin,
            )
    return list(values)


def _call(module: types.ModuleType, name: str, origin: str):
    try:
        return getattr(module, name)()
    except Exception as exc:  # the task's own code failed: report it as bad input
        raise TaskError(f"{name}() raised {type(exc).__name__}: {exc}", path=origin) from None


def load_task_module(task: Task, module_name: str = "cuda_l1_task") -> types.ModuleType:
    try:
        return load_module(task.source, module_name, f"<task {task.key}>")
    except Exception as exc:
        raise TaskError(
            f"executing the module raised {type(exc).__name__}: {exc}", path=task.origin or task.name
        ) from None


def describe_task(task: Task) -> dict:
    """Run the task's module-level code and input builders (not forward) and describe its arguments."""
    import torch

    origin = task.origin or task.name
    module = load_task_module(task)
    torch.manual_seed(0)
    init_args = check_init_args(_call(module, "get_init_inputs", origin), origin)
    args = check_forward_args(_call(module, "get_inputs", origin), origin)
    try:
        model = module.Model(*init_args)
    except Exception as exc:
        raise TaskError(f"Model(*get_init_inputs()) raised {type(exc).__name__}: {exc}", path=origin) from None

    def describe(value):
        if isinstance(value, torch.Tensor):
            return {"shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
        return {"value": value if _is_scalar(value) else repr(value)}

    params = sum(p.numel() for p in model.parameters()) if isinstance(model, torch.nn.Module) else 0
    return {
        **task.summary(),
        "init_inputs": [describe(v) for v in init_args],
        "inputs": [describe(v) for v in args],
        "parameters": params,
    }
