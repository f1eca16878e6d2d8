"""The evaluator: the reward of everything else. The trust boundary is in `sandbox.py`."""

from cuda_l1.evaluate.verdict import Check, Verdict

__all__ = ["Check", "Verdict"]
