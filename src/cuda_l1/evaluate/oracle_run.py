"""The float64 oracle's forward: the reference's float64 copy (inputs.double_model) run as it is, and where
that raises on mixed dtypes, run again with every floating-point tensor an operation takes or gives widened
to float64.

A forward that makes its own tensors (`torch.zeros(layers, batch, hidden)` for an LSTM's initial state, as
most PyTorch RNN examples do) made them float32 beside the float64 model, the oracle raised on the mixed
dtypes, and every check of the task fell back to KernelBench's 1e-2 tolerance: an LSTM that skipped 7 of
its 8 steps in 8 scored 4.1-4.4x, and one in bfloat16 1.6x. Tensors are widened, never dtypes: a random
draw the forward makes (a seeded `torch.randn`) stays the float32 draw the reference makes, only widened
(with float64 as the default dtype it drew other numbers, the reference's "own error" became its noise,
and a bfloat16 candidate passed). Other failures (no float64 kernel, out of memory) are not retried.
"""

from __future__ import annotations

import re
import threading

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

_NARROW = {torch.float32: torch.float64, torch.float16: torch.float64, torch.bfloat16: torch.float64,
           torch.complex64: torch.complex128, torch.complex32: torch.complex128}
# How PyTorch words a mix of dtypes ("expected scalar type Double but found Float", "mat1 and mat2 must
# have the same dtype", "Input type (double) and bias type (float) should be the same", ...).
_DTYPE_ERROR = re.compile(r"dtype|scalar type|type \(|same type|Double|Float|Half|BFloat16|should be the same",
                          re.I)


def _widened(value):
    if isinstance(value, torch.Tensor) and value.dtype in _NARROW:
        return value.to(_NARROW[value.dtype])
    return value


class WidenToFloat64(TorchFunctionMode):
    """Every torch operation called inside takes and gives floating-point tensors in float64 or complex128
    (its dtype arguments are left alone). Slow (a Python call an operation), so it is the second try only."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        args, kwargs = tree_map(_widened, (args, kwargs or {}))
        return tree_map(_widened, func(*args, **kwargs))


def forward_in_float64(model, args: list):
    """`model(*args)` for the oracle; on a dtype error, again under WidenToFloat64 (the first error is the
    one raised when both fail)."""
    try:
        return model(*args)
    except (RuntimeError, TypeError) as first:
        if isinstance(first, torch.OutOfMemoryError) or not _DTYPE_ERROR.search(str(first)):
            raise  # (no float64 kernel, out of memory: a second, slower run would fail the same way)
        try:
            with WidenToFloat64():
                return model(*args)
        except Exception:  # noqa: BLE001 - the first error says what went wrong
            raise first from None


def on_threads(forward, threads: int):
    """`forward()` for a GPU side's float64 oracle fallen back to the CPU, with `threads` torch CPU threads
    (the parent spread the side over as many cores for the request: pinning.spread_side). It runs on a
    thread of its own, which ends after it, and its OpenMP worker threads with it: raised on the side's
    main thread, the count left them alive, pinned back onto the timed core beside the reference's windows.
    Grad mode is per thread: `forward` sets its own."""
    if threads <= 1:
        return forward()
    done: dict = {}

    def body():
        torch.set_num_threads(threads)
        try:
            done["value"] = forward()
        except BaseException as exc:  # noqa: BLE001 - raised again on the calling thread
            done["error"] = exc

    before = torch.get_num_threads()
    worker = threading.Thread(target=body, name="cuda-l1-oracle", daemon=True)
    worker.start()
    worker.join()
    torch.set_num_threads(before)
    if "error" in done:
        raise done["error"]
    return done["value"]
