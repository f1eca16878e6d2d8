"""Contrastive exemplar sampling: which earlier kernels a prompt shows, with their speedups.

The task's correct candidates are put in speedup buckets; N distinct non-empty buckets are drawn
without replacement from a temperature softmax over bucket scores; one candidate is drawn uniformly
from each chosen bucket; the exemplars are returned slowest first. Bucketing (rather than a softmax
over single candidates) keeps a crowd of near-identical 1.0x variants from drowning out the one 3x
kernel, and drawing distinct buckets keeps a spread of speeds for the model to contrast.

Score choice: by default a bucket scores the mean of log(speedup) of its members. Speedups are
ratios, so the log treats 0.5x and 2x as equally far from 1x, and a single 40x outlier bucket does
not take all the probability mass at a moderate temperature the way a raw-mean score would.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from cuda_l1.errors import UserError
from cuda_l1.settings import setting

T = TypeVar("T")
SCORE_KINDS = ("log", "mean")


@dataclass
class SamplerConfig:
    """How exemplars are drawn for a contrastive prompt."""

    n_exemplars: int = setting(2, "exemplars per prompt (the paper shows two)")
    temperature: float = setting(1.0, "softmax temperature over bucket scores: low = fastest bucket, high = uniform")
    bucket_edges: tuple[float, ...] = setting((0.8, 1.0, 1.2, 1.5, 2.0, 3.0, 5.0), "speedups where buckets split")
    score: str = setting("log", 'bucket score: "log" = mean log-speedup (default), "mean" = mean speedup')
    seed: int | None = setting(None, "seed of the sampler's RNG when the caller passes none")

    def __post_init__(self) -> None:
        self.bucket_edges = tuple(float(e) for e in self.bucket_edges)
        if self.n_exemplars < 1:
            raise UserError(f"n_exemplars must be at least 1 (got {self.n_exemplars}).")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise UserError(f"temperature must be a positive number (got {self.temperature}).")
        if any(b <= a for a, b in zip(self.bucket_edges, self.bucket_edges[1:])) or any(
            not (e > 0 and math.isfinite(e)) for e in self.bucket_edges
        ):
            raise UserError(f"bucket_edges must be positive and strictly increasing (got {list(self.bucket_edges)}).")
        if self.score not in SCORE_KINDS:
            raise UserError(f"score must be one of {', '.join(SCORE_KINDS)} (got {self.score!r}).")


def _speedup_attr(item) -> float | None:
    return getattr(item, "speedup", None)


def _usable(speedup) -> bool:
    return isinstance(speedup, (int, float)) and math.isfinite(speedup) and speedup > 0


def bucket_of(speedup: float, edges: Sequence[float]) -> int:
    """Bucket index: 0 below the first edge, len(edges) at or above the last one."""
    return bisect.bisect_right(edges, speedup)


def make_buckets(
    candidates: Sequence[T], edges: Sequence[float], key: Callable[[T], float | None] = _speedup_attr
) -> dict[int, list[T]]:
    """Non-empty buckets of the candidates that have a usable (finite, positive) speedup, input order kept."""
    buckets: dict[int, list[T]] = {}
    for item in candidates:
        speedup = key(item)
        if _usable(speedup):
            buckets.setdefault(bucket_of(speedup, edges), []).append(item)
    return dict(sorted(buckets.items()))


def bucket_scores(
    buckets: dict[int, list[T]], score: str = "log", key: Callable[[T], float | None] = _speedup_attr
) -> dict[int, float]:
    scores = {}
    for index, items in buckets.items():
        values = [float(key(item)) for item in items]
        if score == "log":
            scores[index] = sum(math.log(v) for v in values) / len(values)
        else:
            scores[index] = sum(values) / len(values)
    return scores


def softmax(scores: dict[int, float], temperature: float) -> dict[int, float]:
    if not scores:
        return {}
    top = max(scores.values())  # shift by the max so exp never overflows at tiny temperatures
    weights = {k: math.exp((s - top) / temperature) for k, s in scores.items()}
    total = sum(weights.values())
    return {k: w / total for k, w in weights.items()}


def bucket_probabilities(
    candidates: Sequence[T], config: SamplerConfig | None = None, key: Callable[[T], float | None] = _speedup_attr
) -> dict[int, float]:
    """Probability that each non-empty bucket is drawn first (the softmax over bucket scores)."""
    config = config or SamplerConfig()
    buckets = make_buckets(candidates, config.bucket_edges, key)
    return softmax(bucket_scores(buckets, config.score, key), config.temperature)


def _draw(probabilities: dict[int, float], rng: random.Random) -> int:
    total = sum(probabilities.values())
    point = rng.random() * total
    cumulative = 0.0
    for index, p in probabilities.items():
        cumulative += p
        if point < cumulative:
            return index
    return next(reversed(probabilities))  # rounding left `point` at the very end


def choose_buckets(scores: dict[int, float], n: int, temperature: float, rng: random.Random) -> list[int]:
    """n distinct buckets, drawn one at a time from the softmax over those not yet chosen."""
    remaining = dict(sorted(scores.items()))
    chosen = []
    while remaining and len(chosen) < n:
        index = _draw(softmax(remaining, temperature), rng)
        chosen.append(index)
        del remaining[index]
    return chosen


def sample_exemplars(
    candidates: Sequence[T],
    config: SamplerConfig | None = None,
    rng: random.Random | None = None,
    key: Callable[[T], float | None] = _speedup_attr,
) -> list[T]:
    """Draw up to `n_exemplars` candidates from distinct speedup buckets, returned slowest first.

    candidates: objects with a `.speedup` (or pass `key`); entries without a finite positive speedup
    are ignored. Deterministic for a given rng state (or config.seed when rng is None) and input order.
    """
    config = config or SamplerConfig()
    rng = rng if rng is not None else random.Random(config.seed)
    buckets = make_buckets(candidates, config.bucket_edges, key)
    if not buckets:
        return []
    scores = bucket_scores(buckets, config.score, key)
    chosen = choose_buckets(scores, config.n_exemplars, config.temperature, rng)
    picks = [buckets[index][rng.randrange(len(buckets[index]))] for index in chosen]
    return sorted(picks, key=lambda item: float(key(item)))
