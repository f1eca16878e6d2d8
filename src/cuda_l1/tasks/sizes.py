"""Sizes of the built-in suite: small ones for a CPU, larger ones for a GPU.

A built-in task's module-level size constants (`N = 1280  # rows ...`) are what its `get_inputs` and
`get_init_inputs` read. At those sizes a GPU finishes most references in 0.05-0.2 ms: launch overhead,
not kernels. So each task also states `GPU_SIZES = {"N": 4096, ...}`, chosen so that its reference
takes at least about 0.5 ms on an H100-class GPU (KernelBench enlarged its level-1 tasks for the same
reason). `builtin:gpu` is the suite with those values written in; `builtin:cpu` the small one;
`builtin` means the sizes for the device it runs on (`for_device`). Different sizes are different
tasks: their sources differ, and so do their ids, so their verdicts never mix.
"""

from __future__ import annotations

import ast

CPU, GPU = "cpu", "gpu"
SIZES = (CPU, GPU)
GPU_TARGET_MS = 0.5  # what GPU_SIZES aim for on an H100-class GPU (benchmarks/builtin_sizes.py measures it)


def gpu_sizes(source: str) -> dict[str, int | float]:
    """The task's GPU_SIZES ({} when it has none)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["GPU_SIZES"]:
            value = ast.literal_eval(node.value)
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                raise ValueError("GPU_SIZES must be a dict of constant names to numbers")
            return value
    return {}


def resize(source: str, sizes: dict[str, int | float]) -> str:
    """`source` with the module-level constants named in `sizes` set to those values (comments kept)."""
    lines = source.splitlines(keepends=True)
    found = set()
    edits = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if name in sizes and node.value.lineno == node.value.end_lineno:
            edits.append((node.value.lineno - 1, node.value.col_offset, node.value.end_col_offset, repr(sizes[name])))
            found.add(name)
    missing = sorted(set(sizes) - found)
    if missing:
        raise ValueError(f"GPU_SIZES names constants the task does not define on one line: {', '.join(missing)}")
    for row, start, end, text in sorted(edits, reverse=True):
        line = lines[row].encode()  # ast's column offsets count UTF-8 bytes
        lines[row] = (line[:start] + text.encode() + line[end:]).decode()
    return "".join(lines)


def sized(source: str, sizes: str) -> str:
    """The task's source at `sizes`. GPU_SIZES itself is taken out of both, so the CPU copy is the
    file as it was before GPU sizes existed (its id, and every stored verdict of it, stay valid); the
    GPU copy says in a first comment line that its docstring describes the CPU sizes."""
    if sizes not in SIZES:
        raise ValueError(f"sizes is one of {', '.join(SIZES)} (got {sizes!r})")
    values = gpu_sizes(source)
    plain = _without_gpu_sizes(source)
    if sizes == CPU or not values:
        return plain
    stated = ", ".join(f"{k}={v!r}" for k, v in values.items())
    return f"# GPU sizes ({stated}); the docstring below describes the CPU sizes.\n" + resize(plain, values)


def _without_gpu_sizes(source: str) -> str:
    """`source` without its GPU_SIZES assignment and the comment line just above it."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["GPU_SIZES"]:
            lines = source.splitlines(keepends=True)
            start = node.lineno - 1
            if start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            return "".join(lines[:start] + lines[node.end_lineno:])
    return source


def for_device(source: str, device) -> str:
    """A task source as a command on `device` should load it: `builtin` becomes `builtin:gpu` on a CUDA
    device (a Device or a spelling), anything else is returned as given."""
    if source != "builtin":
        return source
    is_cuda = getattr(device, "is_cuda", None)
    if is_cuda is None:
        is_cuda = str(device).startswith("cuda")
    return "builtin:gpu" if is_cuda else "builtin:cpu"
