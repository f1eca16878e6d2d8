"""How close a candidate's outputs must be: the settings of the precision policy (precision.py applies
them). A module of its own, without torch, so that a configuration (config.EvalConfig) can be sent to a
new worker process, which unpickles it before its first line runs, without importing torch there: the
worker starts its fork server first, whose own torch import then overlaps the worker's.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuda_l1.settings import setting


@dataclass
class ToleranceConfig:
    """How close a candidate's outputs must be."""

    mode: str = setting("oracle", '"oracle" (float64 reference, relative to the '
                        "reference's own error) or \"kernelbench\"")
    error_factor: float = setting(10.0, "candidate error may be this many times the reference's own error")
    floor_eps: float = setting(64.0, "plus this many epsilons of the output dtype (of float32 for 16-bit "
                               "outputs) times max|oracle|")
    low_precision_ulps: float = setting(1.0, "the floor is at least this many epsilons of the output dtype "
                                        "times max|oracle| (what matters for 16-bit outputs)")
    kernelbench_atol: float = setting(1e-2, "KernelBench's absolute tolerance")
    kernelbench_rtol: float = setting(1e-2, "KernelBench's relative tolerance")
