"""The timing protocol as pure functions over recorded windows.

A round is one window per side, in random order, on the same fresh inputs. A window is a batch of
calls that the side runs back to back; its time is what the parent's clock saw, from sending the
request until the side was stopped again and (on a GPU) the device was idle again, so work a side
leaves running after its reply is charged to it. A fixed overhead (the same request, stop and probe
with no calls, measured on the reference's side) is taken off both sides alike.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Iterable

from cuda_l1.evaluate.launch_share import spread_for
from cuda_l1.evaluate.speedup_stats import MEDIAN, conservative_speedup, speedup_ci, summarize


@dataclass
class Window:
    """One side's window as the parent measured it."""

    calls: int
    wall_s: float  # window start (before a GPU window's inputs are written) -> side stopped (CPU) / device idle (GPU)
    reply_s: float  # request sent -> reply received
    idle_wait_s: float = 0.0  # of wall_s: waiting for the device to go idle after the side was stopped
    start_s: float = 0.0  # of wall_s: up to the request (the inputs written, on a GPU; the side resumed)


def per_call_ms(window: Window, overhead_s: float) -> float:
    """Time of one call of the window, with the fixed per-window overhead taken off."""
    return max(window.wall_s - overhead_s, 1e-9) / max(window.calls, 1) * 1e3


# A window no longer than the fixed overhead taken off it measured nothing: its per-call time is the
# floor of per_call_ms. Beyond this share of one side's recorded windows, the speedup is not measured.
UNRESOLVED_SHARE = 0.1


def at_overhead(window: Window, overhead_s: float) -> bool:
    """Whether the window took no longer than the fixed overhead (its calls' time is not resolved)."""
    return window.wall_s <= overhead_s


OVERHEAD_CHECKS = 3  # times an evaluation measures the null windows again (recheck_overhead)


def recheck_overhead(windows: tuple, overhead_s: float, checks_so_far: int) -> bool:
    """Whether to measure the null windows again: a recorded window (of either side) was no longer than
    the overhead taken off it. The overhead is the shortest null window of a few measured at one
    moment; a busy moment there (a futex wake-up, another process) set it above whole windows of a
    fast candidate, whose calls then read as nothing and the verdict as not measured (an 8x
    candidate scored 1.00). The lowest null window seen counts for every round (per_call_all):
    subtracting less only pulls a speedup toward 1, and a candidate cannot reach the reference's
    null windows."""
    return checks_so_far < OVERHEAD_CHECKS and any(at_overhead(w, overhead_s) for w in windows)


def per_call_all(windows: list[tuple], overhead_s: float) -> tuple[list[float], list[float], dict[str, int]]:
    """Per-call times of every recorded round (reference, candidate) with `overhead_s` taken off, and
    how many windows of each side were no longer than it."""
    ref = [per_call_ms(r, overhead_s) for r, _ in windows]
    cand = [per_call_ms(c, overhead_s) for _, c in windows]
    counts = {"reference": sum(at_overhead(r, overhead_s) for r, _ in windows),
              "candidate": sum(at_overhead(c, overhead_s) for _, c in windows)}
    return ref, cand, counts


MAX_REPLANS = 3  # times one evaluation's windows may be widened after a slow start (referee.measure)

HARNESS_FACTOR = 4  # a reference call shorter than this many times the harness's own per-call work is not measured


def harness_call_s(harness_calls: Iterable[float]) -> float:
    """The harness's own work per call: the median of what a side's windows reported (0 when none did)."""
    calls = list(harness_calls)
    return statistics.median(calls) if calls else 0.0


def resolution_note(at_overhead_counts: dict[str, int], rounds: int, overhead_s: float,
                    reference_call_s: float = math.inf, harness_calls: Iterable[float] = ()) -> str | None:
    """Why the speedup is not measured (None: it is): too many of a side's windows were no longer than
    the overhead taken off every window (on a GPU: writing the window's inputs, so a task whose calls
    cost about what copying their inputs does), or that overhead drifted below its estimate; or the
    reference's calls (`reference_call_s`) are within HARNESS_FACTOR times the harness's own per-call
    work (harness_call_s of `harness_calls`: describing a call's outputs, which the reference's side
    times warm once a window). That work runs in the side's process, so a candidate can
    replace it with less: a 32x32 ReLU of about 5 us a call, identical to the reference, scored
    1.68-2.00x that way."""
    if rounds <= 0:
        return None
    harness = harness_call_s(harness_calls)
    if reference_call_s < HARNESS_FACTOR * harness:
        return (f"the reference's calls ({reference_call_s * 1e6:.3g} us) are within {HARNESS_FACTOR} times the "
                f"harness's own work per call ({harness * 1e6:.3g} us), which runs in the candidate's process "
                "and could be skipped there: the speedup is not measured and scores at most 1.00")
    shares = {side: count / rounds for side, count in at_overhead_counts.items()}
    worst = max(shares, key=shares.get)
    if shares[worst] <= UNRESOLVED_SHARE:
        return None
    return (f"{shares[worst]:.0%} of the {worst}'s recorded windows took no longer than the fixed overhead "
            f"taken off each window ({overhead_s * 1e3:.3g} ms): the calls' time is lost in it, so the speedup "
            f"is not measured and scores at most 1.00")


def harness_cap(score: float, reference_ms: float, candidate_ms: float, harness_s: float) -> float:
    """A CPU speedup above 1 credited only as far as it holds with the harness's whole per-call work
    (`harness_s`: doorbell.SideBell.harness_work_s, as the reference's side measured it) added to the
    candidate's calls. That work runs in the candidate's process, and a loop of its own that skipped all
    of it turned the skipped part into speedup (a 16x64 by 64x64 matrix product of 11-15 us a call, the
    reference's own code, read raw 1.10-1.12 so; identical code 0.97-1.00). Never below 1.00 for it, and
    next to nothing where the calls take far longer than that work (a few us)."""
    if not score > 1.0 or not harness_s > 0 or not candidate_ms >= 0:
        return score
    return min(score, max(1.0, reference_ms / (candidate_ms + harness_s * 1e3)))


def calls_for(per_call_s: float, target_s: float, max_calls: int) -> int:
    """How many calls fill a window of `target_s` (at least 1, at most `max_calls`)."""
    if per_call_s <= 0 or not math.isfinite(per_call_s):
        return max_calls
    return max(1, min(max_calls, int(target_s / per_call_s)))


def settle(seconds: float) -> None:
    """The pause after a round's verification (TimingConfig.settle_s): what the verification left on
    the GPU, which favoured the reference's next window, fades in it (benchmarks/results,
    2026-12-02-h200-verification-ablations)."""
    if seconds > 0:
        time.sleep(seconds)


def overhead(null_windows: list[Window]) -> float:
    """The fixed cost of a window with no calls, taken off both sides: the shortest null window. With
    the same number of calls on both sides, taking off too little pulls the speedup toward 1, but too
    much pushes it away from 1 (and past the calls' time, to the floor of per_call_ms): a null window
    slowed by a busy host or a GPU still warming up must not set it (the median once did, on a loaded
    CPU and on KernelBench's scalar multiplication on the H200)."""
    return min(w.wall_s for w in null_windows) if null_windows else 0.0


# TimingConfig.process_spread's defaults: by device kind, and on a GPU for a forward the CPU paces
# (launch_share.py), whose issuing process strays between processes as a CPU side does
PROCESS_SPREAD = {"cuda": 0.0075, "cuda_launch_bound": 0.04, "cpu": 0.04}
Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


def process_spread(config, launch_share: float | None = None) -> float:
    """TimingConfig.process_spread of an EvalConfig when set; else its device's default, on a GPU moved
    toward the launch-bound one by the reference's launch share (None: not measured)."""
    spread = config.timing.process_spread
    if spread is not None:
        return spread
    if not config.device.startswith("cuda"):
        return PROCESS_SPREAD["cpu"]
    return spread_for(launch_share, PROCESS_SPREAD["cuda"], PROCESS_SPREAD["cuda_launch_bound"])


@dataclass
class Estimate:
    """The speedup's point, its interval (`lo`, `hi`: the rounds' bootstrap interval widened by the
    spread between processes) and the rounds' own interval (`within_lo`, `within_hi`)."""

    point: float
    lo: float
    hi: float
    reference_ms: float
    candidate_ms: float
    within_lo: float = math.nan
    within_hi: float = math.nan

    @property
    def relative_width(self) -> float:
        """Of the rounds' own interval: what more rounds can narrow (the stop rule's "narrow")."""
        lo, hi = (self.within_lo, self.within_hi) if math.isfinite(self.within_lo) else (self.lo, self.hi)
        return (hi - lo) / self.point if self.point > 0 else math.inf

    @property
    def score(self) -> float:
        return conservative_speedup(self.point, self.lo, self.hi)


def estimate(ref_ms: list[float], cand_ms: list[float], seed: int,
             candidate_first: list[bool] | None = None, spread: float = 0.0, trim: float = MEDIAN) -> Estimate:
    """Speedup = median reference time / median candidate time over paired rounds, within each order
    class of rounds (speedup_stats.speedup_ci), with a bootstrap interval; one statistic for the point,
    the interval and the score.

    The bootstrap resamples rounds of one pair of processes, so it cannot see what differs from one
    pair to the next: identical code in two sides measured 0.914 and 1.078 on a 2-core CPU host,
    and 0.965 on the H200, with intervals that held neither 1 nor each other. `spread` (one standard
    deviation of that difference, in log speedup) is added to each half of the interval in quadrature,
    so that such a difference scores 1.00 and a real speedup keeps nearly all of its score. (`trim`:
    speedup_ci's, for replays.)"""
    point, lo, hi = speedup_ci(ref_ms, cand_ms, candidate_first, seed=seed, trim=trim)
    wide_lo, wide_hi = widen(point, lo, hi, spread)
    return Estimate(point, wide_lo, wide_hi, statistics.median(ref_ms), statistics.median(cand_ms), lo, hi)


def widen(point: float, lo: float, hi: float, spread: float) -> tuple[float, float]:
    """The interval (lo, hi) around `point` with a between-process term of `spread` (a standard
    deviation of the log speedup) added to each half in quadrature."""
    if spread <= 0 or not all(map(math.isfinite, (point, lo, hi))) or min(point, lo, hi) <= 0:
        return lo, hi
    extra = (Z95 * spread) ** 2
    # A half on the wrong side of the point (not seen with medians, but not ruled out) counts as
    # none: the spread still widens it, so no interval ever escapes the between-process term.
    below = math.sqrt(max(math.log(point / lo), 0.0) ** 2 + extra)
    above = math.sqrt(max(math.log(hi / point), 0.0) ** 2 + extra)
    return point * math.exp(-below), point * math.exp(above)


def stop_reason(rounds: int, est: Estimate | None, elapsed_s: float, *, min_rounds: int, max_rounds: int,
                max_time_s: float, target_width: float, thresholds: tuple[float, ...] = (),
                margin: float = 0.05) -> str | None:
    """Why timing may stop now (None: go on). "narrow": the interval is as narrow as asked; "decided":
    it lies on one side of every speedup the caller decides at (a bucket edge, the best so far), clear
    of each by `margin` (relative), so more rounds would not change what the caller does. The margin
    is what keeps looking after every few rounds from deciding on noise: identical code on a busy CPU
    strays about 5%. "rounds" / "time": the caps. Nothing stops timing before `min_rounds`, the time
    cap included (the evaluation's own deadline bounds it): a speedup from one or two rounds has an
    interval of no width, and so the score of a sure thing."""
    if rounds >= max_rounds:
        return "rounds"
    if rounds < min_rounds or est is None:
        return None
    if elapsed_s >= max_time_s:
        return "time"
    if est.relative_width <= target_width:
        return "narrow"
    if thresholds and all(est.lo > t * (1 + margin) or est.hi < t * (1 - margin) for t in thresholds):
        return "decided"
    return None


def done(rounds: int, est: Estimate | None, elapsed_s: float, *, min_rounds: int, max_rounds: int,
         max_time_s: float, target_width: float, thresholds: tuple[float, ...] = (), margin: float = 0.05) -> bool:
    """Stop once the interval is narrow enough (or decides the caller's thresholds), or at the caps."""
    return stop_reason(rounds, est, elapsed_s, min_rounds=min_rounds, max_rounds=max_rounds, max_time_s=max_time_s,
                       target_width=target_width, thresholds=thresholds, margin=margin) is not None


def window_order(sides: list, previous: list | None, rng) -> list:
    """The order of the two sides' windows in a round: at random in the first round of each pair,
    and the reverse of it in the second (previous = the first round's order). The recorded rounds
    start a pair of their own (referee.measure), so each order comes up equally often within one
    round and neither order class is too small to be taken alone (speedup_stats.order_classes). A
    candidate that counts its windows knows its place in the second round of a pair; that gains it
    nothing, since the estimate cancels an effect of position that multiplies both sides alike."""
    if previous is not None:
        return list(reversed(previous))
    order = list(sides)
    rng.shuffle(order)
    return order


def position_effect(rounds: "Recorded") -> dict:
    """Each side's median per-call time when its window came second in the round over when it came
    first. An honest pair of sides shows about the same ratio on both; a reference that is slower
    only right after the candidate's window shows here, for an audit."""
    def ratio(samples: list[float], second: list[bool]) -> float | None:
        late = [x for x, s in zip(samples, second) if s]
        early = [x for x, s in zip(samples, second) if not s]
        return float(f"{statistics.median(late) / statistics.median(early):.4g}") if late and early else None

    cand_second = [not c for c in rounds.candidate_first]
    return {"reference_second_over_first": ratio(rounds.reference_ms, rounds.candidate_first),
            "candidate_second_over_first": ratio(rounds.candidate_ms, cand_second)}


def summary(samples: list[float]) -> dict:
    return summarize(samples).to_dict()


@dataclass
class Recorded:
    """The recorded rounds: per-call times of each side and which side's window came first."""

    reference_ms: list[float]
    candidate_ms: list[float]
    candidate_first: list[bool]


PROTOCOL = ("alternating windows of back-to-back calls on fresh inputs, timed by the parent's clock from "
            "request until the side was stopped and the device idle; caches flushed between windows")


def report(rounds: Recorded, calls_per_window: dict, overhead_s: float, last_idle_wait_s: float,
           probe_idle_s: float, phases_s: dict[str, float]) -> dict:
    """The verdict's timing record: summaries, the protocol's parameters, and every round's samples
    (so an audit can recompute the estimate) and where the measuring time went."""
    return {
        "protocol": PROTOCOL,
        "reference": summary(rounds.reference_ms),
        "candidate": summary(rounds.candidate_ms),
        "rounds": len(rounds.candidate_ms),
        "calls_per_window": dict(calls_per_window),
        "window_overhead_ms": overhead_s * 1e3,
        "last_idle_wait_ms": last_idle_wait_s * 1e3,
        "ci_level": 0.95,
        "device_probe_idle_us": probe_idle_s * 1e6,
        "phases_s": {k: round(v, 3) for k, v in phases_s.items()},
        "position_effect": position_effect(rounds),
        "samples": {"reference_ms": [float(f"{x:.5g}") for x in rounds.reference_ms],
                    "candidate_ms": [float(f"{x:.5g}") for x in rounds.candidate_ms],
                    "candidate_first": list(rounds.candidate_first)},
    }
