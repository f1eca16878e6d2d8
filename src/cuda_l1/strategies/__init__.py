"""Offline strategies: candidates for any task without an LLM (eager, torch.compile, CUDA graphs).

They are the baselines every report compares against: an LLM kernel is only interesting when it beats
what `torch.compile` or a captured CUDA graph give for free.

    from cuda_l1.strategies import STRATEGIES
    source = STRATEGIES["compile"].generate(task)   # a candidate module defining ModelNew
    ok, note = STRATEGIES["cudagraph"].applies("cpu")  # (False, "... needs CUDA ...")
"""

from __future__ import annotations

from cuda_l1.errors import UserError
from cuda_l1.strategies import sources
from cuda_l1.strategies.base import Strategy, is_cuda_device

_CUDA_GRAPH_NOTE = "uses CUDA graphs, which exist only on CUDA devices; skipped on {device}."

STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            name="eager",
            description="the reference Model unchanged (calibration baseline)",
            code=sources.EAGER,
        ),
        Strategy(
            name="compile",
            description="torch.compile, default mode",
            code=sources.compile_code(None),
        ),
        Strategy(
            name="compile-max",
            description='torch.compile, mode="max-autotune"',
            code=sources.compile_code("max-autotune"),
        ),
        Strategy(
            name="compile-ro",
            description='torch.compile, mode="reduce-overhead" (CUDA graphs)',
            code=sources.COMPILE_REDUCE_OVERHEAD,
            cuda_only=True,
            off_cuda_note="compile-ro " + _CUDA_GRAPH_NOTE,
        ),
        Strategy(
            name="cudagraph",
            description="the reference forward captured once per input signature in a CUDA graph and replayed",
            code=sources.CUDAGRAPH,
            cuda_only=True,
            off_cuda_note="cudagraph " + _CUDA_GRAPH_NOTE,
        ),
    )
}

# The strategies every report measures the best candidate against, in the order reports show them.
_BASELINES = ("eager", "compile", "compile-ro", "cudagraph")


def baseline_names() -> list[str]:
    """Names of the strategies used as report baselines."""
    return list(_BASELINES)


def get_strategy(name: str) -> Strategy:
    """The registered strategy called `name`; a UserError listing the known names otherwise."""
    try:
        return STRATEGIES[name]
    except KeyError:
        known = ", ".join(STRATEGIES)
        raise UserError(f"unknown strategy {name!r}; known strategies: {known}.") from None


def applicable(device: str) -> dict[str, tuple[bool, str]]:
    """For every registered strategy: whether it applies on `device`, and the note when it does not."""
    return {name: s.applies(device) for name, s in STRATEGIES.items()}


__all__ = ["STRATEGIES", "Strategy", "applicable", "baseline_names", "get_strategy", "is_cuda_device"]
