"""Running a task's code: build its module, its inputs and its model, and check that the reference runs.

Used by the trusted side of the evaluator and by `tasks show`. The child harness has its own
minimal copy of module loading so that it does not import this package's trusted code paths.
"""

from __future__ import annotations

import linecache
import numbers
import sys
import time
import traceback
import types
from dataclasses import dataclass
from typing import Any

from cuda_l1.errors import TaskError
from cuda_l1.tasks.deadline import DEFAULT_TASK_TIMEOUT_S, task_deadline
from cuda_l1.tasks.determinism import first_difference, input_digest, output_sample
from cuda_l1.tasks.task import Task
from cuda_l1.tasks.task_failures import TASK_FAILURES, describe_exception, is_task_failure


# The file names candidate and reference code run under: tracebacks and error details name them.
CANDIDATE_FILENAME = "candidate.py"
REFERENCE_FILENAME = "reference.py"


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
    """A constructor argument: any number (numpy's too), a string or None. These never leave the process
    that builds the model (each side rebuilds them from the task's source)."""
    return value is None or isinstance(value, (numbers.Number, bool, str))


def _is_wire_scalar(value: Any) -> bool:
    """A forward argument or output that is not a tensor: None, bool, int, float (numpy's float64 is one)
    or str, what a message between the sides can carry; a complex, Decimal or numpy integer stopped the
    parent when it was sent."""
    return value is None or isinstance(value, (bool, int, float, str))


def check_forward_args(values: Any, origin: str, on_meta: bool = False) -> list:
    """get_inputs() must return a list (or tuple) of dense tensors and scalars (`on_meta`: built on the
    meta device on purpose, to describe shapes)."""
    import torch

    if not isinstance(values, (list, tuple)):
        raise TaskError(
            f"get_inputs() returned {type(values).__name__}; it must return a list of tensors and scalars "
            "(the arguments of Model.forward).",
            path=origin,
        )
    for index, value in enumerate(values):
        if not (isinstance(value, torch.Tensor) or _is_wire_scalar(value)):
            raise TaskError(
                f"get_inputs()[{index}] is a {type(value).__name__}; forward arguments must be tensors or "
                "scalars (int, float, bool).",
                path=origin,
            )
        unusable = _unusable_tensor(value, on_meta) if isinstance(value, torch.Tensor) else ""
        if unusable:
            raise TaskError(f"get_inputs()[{index}] is {unusable}; forward arguments must be dense tensors.",
                            path=origin)
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


def task_filename(task: Task) -> str:
    """The file name a task's code runs under: where it came from, so tracebacks point there."""
    return task.origin or f"{task.name}.py"


def candidate_traceback(exc: BaseException, filename: str = CANDIDATE_FILENAME, limit: int = 6000) -> str:
    """A traceback cut to what the author of `filename` can act on.

    Keeps the frames of that file, and the innermost frame when the error surfaced elsewhere (inside
    torch, say: that is where the message comes from), then the exception itself; harness and library
    frames in between are dropped and counted. Chained exceptions are left out except for their last
    line. The result is at most `limit` characters (its end is kept)."""
    info = traceback.TracebackException(type(exc), exc, exc.__traceback__, capture_locals=False)
    frames = list(info.stack)
    mine = [i for i, f in enumerate(frames) if f.filename == filename]
    keep = set(mine)
    # Where the error surfaced, unless that is the compiler reading the candidate: a SyntaxError
    # names the candidate's own line already.
    surfaced_in_compile = isinstance(exc, SyntaxError) and getattr(exc, "filename", None) == filename
    if frames and (not mine or mine[-1] != len(frames) - 1) and not surfaced_in_compile:
        keep.add(len(frames) - 1)
    lines: list[str] = []
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    if cause is not None:
        lines.append("".join(traceback.format_exception_only(type(cause), cause)).rstrip())
        lines.append("which led to:")
    if keep:
        lines.append(f"Traceback ({filename} frames; {len(frames) - len(keep)} harness and library frame(s) "
                     "left out):")
        for index in sorted(keep):
            lines.append(traceback.StackSummary.from_list([frames[index]]).format()[0].rstrip("\n"))
    lines.append("".join(info.format_exception_only()).rstrip())
    text = "\n".join(lines)
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def _call(module: types.ModuleType, name: str, origin: str):
    try:
        return getattr(module, name)()
    except TASK_FAILURES as exc:  # the task's own code failed: report it as bad input
        if not is_task_failure(exc):
            raise
        raise TaskError(f"{name}() raised {_where(exc, origin)}", path=origin) from None


def _where(exc: BaseException, filename: str) -> str:
    """'ValueError: boom (line 12: raise ValueError("boom"))': the error and the task's own line."""
    own = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    text = describe_exception(exc)
    if own:
        text += f" (line {own[-1].lineno}: {(own[-1].line or '').strip()})"
    return text


def load_task_module(task: Task, module_name: str = "cuda_l1_task",
                     timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S) -> types.ModuleType:
    """Execute the task's module, for at most `timeout_s` (deadline.py); its failures are TaskErrors."""
    filename = task_filename(task)
    try:
        with task_deadline(timeout_s, "importing the task", filename):
            return load_module(task.source, module_name, filename)
    except TaskError:  # its deadline, already in words
        raise
    except TASK_FAILURES as exc:
        if not is_task_failure(exc):
            raise
        raise TaskError(f"executing the module raised {_where(exc, filename)}", path=filename) from None


def check_reference(task: Task, device: str = "cpu", seed: int = 0, mode: str = "train",
                    timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S) -> None:
    """Run the reference once as the evaluator will: module, get_init_inputs, Model(...), get_inputs,
    forward. Raises TaskError naming the task's file and line when any of them fails, so a broken
    reference is reported as bad input before any candidate is blamed for it; each step, the import
    and the run, has `timeout_s`."""
    module = load_task_module(task, module_name=f"cuda_l1_check_{task.id}", timeout_s=timeout_s)
    try:
        run_reference_once(module, task_filename(task), device, seed, mode, timeout_s=timeout_s)
    finally:
        sys.modules.pop(module.__name__, None)


@dataclass(frozen=True)
class FirstRun:
    """What the reference's first run tells the evaluator."""

    output_bytes: int  # the call's tensor outputs (what the input slots are budgeted on: see TaskEnv)
    launch_share: float | None = None  # on a GPU, when asked: how launch-bound it is (launch_share.py)
    ignores_inputs: bool = False  # its outputs were the same for a second draw of its inputs (see below)


def run_reference_once(module: types.ModuleType, origin: str, device: str = "cpu", seed: int = 0,
                       mode: str = "train", timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S,
                       measure_launches: bool = False) -> FirstRun:
    """check_reference on a loaded module: its inputs checked, its model built and called on `device`,
    in `mode` (inputs.build_model), twice on the same inputs (a forward giving other outputs the
    second time is refused: tasks/determinism.py), and on a GPU with `measure_launches` a few calls more for
    its launch share. A TaskError names `origin` and the line of the task's code that failed. All of it
    within `timeout_s`."""
    with task_deadline(timeout_s, "the reference's first run (its inputs, its model, one forward)", origin):
        return _run_reference_once(module, origin, device, seed, mode, measure_launches)


def _run_reference_once(module: types.ModuleType, origin: str, device: str, seed: int, mode: str,
                        measure_launches: bool = False) -> FirstRun:
    import torch

    from cuda_l1.evaluate import inputs as inputs_mod

    init_args = check_init_args(_call_seeded(inputs_mod.make_init_inputs, module, seed, origin,
                                             "get_init_inputs"), origin)
    try:
        model = inputs_mod.build_model(module.Model, init_args, seed, device, mode)
    except TASK_FAILURES as exc:
        if not is_task_failure(exc):
            raise
        raise TaskError(f"Model(*get_init_inputs()) raised {_where(exc, origin)}", path=origin) from None
    args = check_forward_args(_call_seeded(inputs_mod.make_inputs, module, seed, origin, "get_inputs",
                                           device), origin)
    inputs_digest = input_digest(list(args))  # to tell a forward changing its inputs from one drawing random numbers
    try:
        started = time.perf_counter()
        with torch.no_grad():
            out = model(*args)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)  # this worker's GPU, not whichever the thread last used
        first_s = time.perf_counter() - started
    except TASK_FAILURES as exc:
        if not is_task_failure(exc):
            raise
        raise TaskError(f"Model.forward(*get_inputs()) raised {_where(exc, origin)}", path=origin) from None
    # Every tensor of the output, nested ones too (an LSTM's (out, (h, c))): the slots are sized on it.
    try:
        leaves = inputs_mod.flatten_outputs(out)[1]
    except RecursionError:
        raise TaskError("Model.forward(*get_inputs()) returned a structure nested too deeply to compare",
                        path=origin) from None
    for index, leaf in enumerate(leaves):
        unusable = _unusable_tensor(leaf, output=True) if isinstance(leaf, torch.Tensor) else (
            "" if _is_wire_scalar(leaf) else f"a {type(leaf).__name__}")
        if unusable:  # no candidate could match it: the task's fault, not the candidate's
            raise TaskError(f"Model.forward(*get_inputs()) returned {unusable} as output {index}; outputs must be "
                            "dense tensors with values, or scalars (None, bool, int, float, str)", path=origin)
    output_bytes = sum(x.numel() * x.element_size() for x in leaves if isinstance(x, torch.Tensor))
    sample = output_sample(leaves)
    outputs_digest = input_digest(leaves)  # every byte: outputs "the same" for other inputs must be exactly so
    out = leaves = leaf = None  # no output of the first call held through the calls after it
    if input_digest(list(args)) != inputs_digest:
        raise TaskError("Model.forward changes its inputs (they differ after its first call): each side's inputs are "
                        "checked to be as written after every window, so no candidate can be checked against it",
                        path=origin)
    # The same inputs again: a reference drawing random numbers (dropout in train mode) cannot be matched. Its
    # second outputs are the task's too (compared inside _again: an array there raised in the comparison).
    changed = _again(lambda: first_difference(sample, output_sample(inputs_mod.flatten_outputs(model(*args))[1])),
                     origin)
    if changed:
        raise TaskError(f"Model.forward gave other outputs for the same inputs on a second call ({changed}): it draws "
                        "random numbers (dropout in train mode, say; --module-mode eval turns that off) or keeps "
                        "state between calls, and no candidate can be checked against it", path=origin)
    from cuda_l1.evaluate.launch_share import SLOW_S, launch_share

    share = None
    if measure_launches and device.startswith("cuda") and first_s <= SLOW_S:
        share = _again(lambda: launch_share(lambda: model(*args), device), origin)
    # Other inputs (another seed's draw): outputs that stay the same, byte for byte (a sample within a tolerance
    # flagged x + 1e4 and a one-hot of each row's argmax), do not depend on the inputs (KernelBench
    # level 2's softmax over a dimension of size 1 is all ones). Any constant is then correct, and a
    # candidate returning one scored 8-9x: the task's doing, not a cheat, so verdicts say so (not refused).
    # One input set at a time: the first is let go before the second is drawn.
    args = None
    other = check_forward_args(_call_seeded(inputs_mod.make_inputs, module, seed + 1, origin, "get_inputs", device),
                               origin)
    same = input_digest(list(other)) != inputs_digest and _again(  # (inputs drawn alike tell nothing)
        lambda: input_digest(inputs_mod.flatten_outputs(model(*other))[1]), origin) == outputs_digest
    return FirstRun(output_bytes, share, ignores_inputs=same)


def _again(calls, origin: str):
    """`calls()` (more calls of the reference's forward, without gradients): it ran once, so a later
    call failing is the task's fault all the same."""
    import torch

    try:
        with torch.no_grad():
            return calls()
    except TASK_FAILURES as exc:
        if not is_task_failure(exc):
            raise
        raise TaskError(f"Model.forward(*get_inputs()) raised on a second call: {_where(exc, origin)}",
                        path=origin) from None


def _unusable_tensor(value, on_meta: bool = False, output: bool = False) -> str:
    """Why a tensor cannot be an argument or an output compared by value ("" when it can)."""
    import torch

    if value.layout != torch.strided:
        return f"a {str(value.layout).replace('torch.', '')} tensor"
    if value.device.type == "meta" and not on_meta:
        return "a tensor on the meta device (no values)"
    if not output:  # an input is copied by value into the sides' slots: a plain tensor there
        return ""
    if type(value) is not torch.Tensor:  # a side describes no other type by its memory: never compared
        return f"a {type(value).__name__} (a tensor subclass: return a plain tensor, e.g. .as_subclass(torch.Tensor))"
    if value.is_conj() or value.is_neg():  # its memory holds other values than it has
        return "a lazily conjugated or negated view (return .resolve_conj() or .resolve_neg())"
    return ""


def _call_seeded(fn, module, seed: int, origin: str, name: str, *rest):
    try:
        return fn(module, seed, *rest)
    except TASK_FAILURES as exc:  # the task's own code failed: report it as bad input
        if not is_task_failure(exc):
            raise
        raise TaskError(f"{name}() raised {_where(exc, origin)}", path=origin) from None


def describe_task(task: Task, on_meta: bool = False, timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S) -> dict:
    """Run the task's module-level code and input builders (not forward) and describe its arguments.
    `on_meta`: build them on torch's meta device (shapes only, no memory: GPU-sized tasks on a laptop)."""
    import contextlib

    import torch

    origin = task.origin or task.name
    module = load_task_module(task, timeout_s=timeout_s)
    torch.manual_seed(0)
    with (torch.device("meta") if on_meta else contextlib.nullcontext(),
          task_deadline(timeout_s, "building the task's model and inputs", origin)):
        init_args = check_init_args(_call(module, "get_init_inputs", origin), origin)
        args = check_forward_args(_call(module, "get_inputs", origin), origin, on_meta)
        try:
            model = module.Model(*init_args)
        except TASK_FAILURES as exc:
            if not is_task_failure(exc):
                raise
            raise TaskError(f"Model(*get_init_inputs()) raised {describe_exception(exc)}", path=origin) from None

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


def meta_footprint(source: str, timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S) -> dict[str, int]:
    """Elements and bytes of a task's inputs and outputs and its parameter count, with forward run on
    torch's meta device: shapes only, no memory (how GPU sizes are checked on a machine without one)."""
    module = types.ModuleType("task_footprint")
    with task_deadline(timeout_s, "the task's shapes on the meta device", "<task>"):
        exec(compile(source, "<task>", "exec"), module.__dict__)
        return module_footprint(module)


def module_footprint(module) -> dict[str, int]:
    """meta_footprint of a task module already loaded (its module-level code is not run again)."""
    import torch

    with torch.device("meta"):
        inputs = module.get_inputs()
        model = module.Model(*module.get_init_inputs())
        out = model(*inputs)
    outputs = out if isinstance(out, (list, tuple)) else [out]
    tensors = lambda xs: [x for x in xs if isinstance(x, torch.Tensor)]  # noqa: E731
    return {"input_elements": sum(x.numel() for x in tensors(inputs)),
            "output_elements": sum(x.numel() for x in tensors(outputs)),
            "input_bytes": sum(x.numel() * x.element_size() for x in tensors(inputs)),
            "output_bytes": sum(x.numel() * x.element_size() for x in tensors(outputs)),
            "parameters": sum(p.numel() for p in model.parameters()) if isinstance(model, torch.nn.Module) else 0}
