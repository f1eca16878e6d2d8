"""Timing statistics: per-side summaries, the speedup's confidence interval, conservative scoring."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass


@dataclass
class Summary:
    n: int
    median_ms: float
    mean_ms: float
    stdev_ms: float
    stderr_ms: float
    min_ms: float
    max_ms: float

    @property
    def rse(self) -> float:
        """Relative standard error of the mean."""
        return self.stderr_ms / self.mean_ms if self.mean_ms > 0 else math.inf

    def to_dict(self) -> dict:
        return {**asdict(self), "rse": self.rse}


def summarize(samples: list[float]) -> Summary:
    n = len(samples)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    mean = statistics.fmean(samples)
    stdev = statistics.stdev(samples) if n > 1 else 0.0
    return Summary(n, statistics.median(samples), mean, stdev, stdev / math.sqrt(n), min(samples), max(samples))


def speedup_ci(ref: list[float], cand: list[float], *, level: float = 0.95, resamples: int = 2000,
               seed: int = 0) -> tuple[float, float, float]:
    """Speedup = median(ref) / median(cand), with a percentile-bootstrap interval over paired rounds
    (reference and candidate were timed in alternation, so round i of each belongs together)."""
    import torch  # vectorised resampling: about 40x faster than a Python loop over 2000 x 400 rounds

    n = min(len(ref), len(cand))
    if n == 0:
        return math.nan, math.nan, math.nan
    ref, cand = ref[:n], cand[:n]
    point = statistics.median(ref) / statistics.median(cand)
    if n < 3:  # resampling one or two pairs gives an interval of no width: no interval at all
        return point, math.nan, math.nan
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(n, (resamples, n), generator=gen)
    pairs = torch.tensor([ref, cand], dtype=torch.float64)
    ordered = pairs[:, idx].sort(dim=2).values
    medians = (ordered[..., (n - 1) // 2] + ordered[..., n // 2]) / 2  # as statistics.median: mean of the middle two
    ratios = (medians[0] / medians[1]).sort().values.tolist()
    lo = ratios[int((1 - level) / 2 * resamples)]
    hi = ratios[min(int((1 + level) / 2 * resamples), resamples - 1)]
    return point, lo, hi


def conservative_speedup(point: float, lo: float, hi: float, digits: int = 2) -> float:
    """Score toward 1: the end of the confidence interval nearest 1 (1.0 when the interval holds 1),
    then rounded toward 1. A speedup that the measurement cannot tell from noise scores 1.0."""
    if not all(map(math.isfinite, (point, lo, hi))):
        return 1.0
    if lo > 1.0:
        value, rounding = min(point, lo), math.floor
    elif hi < 1.0:
        value, rounding = max(point, hi), math.ceil
    else:
        return 1.0
    scale = 10**digits
    return rounding(round(value * scale, 9)) / scale  # round() first: 0.55 * 100 is 55.000000000000007
