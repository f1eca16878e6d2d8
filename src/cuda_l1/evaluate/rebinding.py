"""What a side re-binds in torch, time, os and builtins while it imports or runs (monkeypatching).

Reported as signals only: nothing a side says about itself decides a verdict (it could lie), but a
candidate that replaces `torch.cuda.synchronize` or `time.perf_counter` is worth naming in the
verdict. The referee's own clock and outside reads are what make such re-binding useless.
"""

from __future__ import annotations

import builtins
import os
import time


def _guarded() -> dict:
    """The namespaces watched, by name."""
    import torch
    import torch.nn.functional as F

    return {"torch": vars(torch), "torch.Tensor": vars(torch.Tensor), "torch.nn.functional": vars(F),
            "torch.nn.Module": vars(torch.nn.Module), "torch.cuda": vars(torch.cuda), "time": vars(time),
            "builtins": vars(builtins), "os": vars(os)}


def snapshot() -> dict:
    """Every callable or class of the watched namespaces, by dotted name."""
    return {f"{space}.{name}": value for space, mapping in _guarded().items()
            for name, value in list(mapping.items()) if callable(value) or isinstance(value, type)}


def rebound(before: dict) -> list[str]:
    """Names (at most 20) bound to another object than in `before`."""
    after = snapshot()
    return sorted(k for k, v in before.items() if after.get(k, v) is not v)[:20]
