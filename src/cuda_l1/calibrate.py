"""The A/A noise check: identical code timed against itself, to show how far this host's numbers stray.

    cuda-l1 calibrate builtin            # on demand
    cuda-l1 bench / optimize ...         # first thing in every run (--no-calibrate to skip)

The candidate is the `eager` strategy, the reference Model unchanged, so any speedup it gets is noise.
A set of such verdicts (the few calibration tasks, or a run's own eager candidates) is *too noisy*
when the median |raw speedup - 1| is outside the band (5% on CPU, 2% on a GPU), when more than a
third of the raw speedups fall outside it, when more than a third score other than 1.00 (their 95%
interval excludes 1: identical code "measured" as faster or slower), or when identical code did not
even come out ok. Results of such a host are marked
in summary.json, report.html and on the console, never silently published.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from cuda_l1.settings import setting
from cuda_l1.store.set_aside import set_aside
from cuda_l1.tasks import Task

CALIBRATION_NAME = "calibration.json"


@dataclass
class CalibrationConfig:
    """How the A/A check runs and what counts as too noisy."""

    tasks: int = setting(3, "tasks timed against themselves (spread over the levels present)")
    quick: bool = setting(True, "quick timing: the check costs seconds, not minutes")
    band_cpu: float = setting(0.05, "identical code may measure within 1 +- this on a CPU")
    band_gpu: float = setting(0.02, "... and within 1 +- this on a GPU")
    max_off_fraction: float = setting(1 / 3, "share of verdicts that may fall outside the "
                                      "band, or score other than 1.00")


def band_for(device: str, config: CalibrationConfig | None = None) -> float:
    config = config or CalibrationConfig()
    return config.band_gpu if device.startswith("cuda") else config.band_cpu


def pick_tasks(tasks: Sequence[Task], count: int) -> list[Task]:
    """`count` tasks spread over the levels (the first of each level in turn), in a fixed order, so
    reruns calibrate on the same tasks."""
    by_level: dict[int, list[Task]] = {}
    for task in tasks:
        by_level.setdefault(task.level, []).append(task)
    picked: list[Task] = []
    depth = 0
    while len(picked) < count and any(depth < len(group) for group in by_level.values()):
        for level in sorted(by_level):
            if depth < len(by_level[level]) and len(picked) < count:
                picked.append(by_level[level][depth])
        depth += 1
    return picked


def judge_spread(points: Iterable[dict], band: float, max_off_fraction: float = 1 / 3,
                 failures_are_noise: bool = True) -> dict:
    """Summary of A/A points (dicts with status, raw_speedup, speedup): the spread and whether it is
    too noisy, with the reason in words. `failures_are_noise`: an evaluation that did not come out
    ok makes the check fail (the A/A check's few tasks were picked to run); else (a run's own eager
    candidates, one of which may fail as its task's failure, a timeout on a huge task say) only
    failures beyond `max_off_fraction` of them do, and none ok is no check at all, not a noisy host."""
    points = list(points)
    ok = [p for p in points if p.get("status") == "ok" and p.get("raw_speedup") is not None]
    raws = [float(p["raw_speedup"]) for p in ok]
    deviation = statistics.median([abs(r - 1.0) for r in raws]) if raws else None
    off = [p for p in ok if p.get("speedup") is not None and round(float(p["speedup"]), 2) != 1.0]
    reasons = []
    failed = len(points) - len(ok)
    if failed and (failures_are_noise or (ok and failed > max_off_fraction * len(points))):
        reasons.append(f"{failed} of {len(points)} identical-code evaluations did not come out ok")
    if deviation is not None and deviation > band:
        reasons.append(f"identical code measured a median {100 * deviation:.1f}% away from 1.00 "
                       f"(allowed: {100 * band:g}%)")
    outside = [r for r in raws if abs(r - 1.0) > band]
    if raws and len(outside) > max_off_fraction * len(raws):
        reasons.append(f"{len(outside)} of {len(raws)} identical-code measurements fall outside 1 +- {band:g} "
                       f"(allowed: {max_off_fraction:.0%})")
    if ok and len(off) > max_off_fraction * len(ok):
        reasons.append(f"{len(off)} of {len(ok)} identical-code intervals exclude 1.00 "
                       f"(allowed: {max_off_fraction:.0%})")
    return {
        "n": len(points),
        "n_ok": len(ok),
        "n_failed": failed,
        "band": band,
        "raw_median": statistics.median(raws) if raws else None,
        "raw_min": min(raws) if raws else None,
        "raw_max": max(raws) if raws else None,
        "median_deviation": deviation,
        "n_outside_band": len(outside),
        "n_scored_off": len(off),
        "too_noisy": bool(reasons),
        "reasons": reasons,
    }


def _point(task: Task, verdict) -> dict:
    return {"task": task.key, "task_id": task.id, "status": verdict.status, "raw_speedup": verdict.raw_speedup,
            "speedup": verdict.speedup, "ci": list(verdict.ci) if verdict.ci else None,
            "reference_ms": verdict.reference_ms, "candidate_ms": verdict.candidate_ms,
            "elapsed_s": round(verdict.elapsed_s, 2) if verdict.elapsed_s else None,
            "reasons": list(verdict.reasons)[:2]}


def run_calibration(tasks: Sequence[Task], eval_config, config: CalibrationConfig | None = None,
                    on_point: Callable[[dict], None] | None = None) -> dict:
    """Evaluate the unchanged reference against itself on a few of `tasks`; return the points and the
    judgement (see `judge_spread`)."""
    from cuda_l1.evaluate.config import TimingConfig
    from cuda_l1.evaluate.evaluator import Evaluator
    from cuda_l1.strategies import get_strategy

    config = config or CalibrationConfig()
    eager = get_strategy("eager")
    eval_config = dataclasses.replace(eval_config, remeasure=False)
    if config.quick:
        eval_config = dataclasses.replace(eval_config, timing=TimingConfig.quick())
    started = time.monotonic()
    points = []
    for task in pick_tasks(tasks, config.tasks):
        evaluator = Evaluator(task, dataclasses.replace(eval_config))
        try:
            point = _point(task, evaluator.evaluate(eager.generate(task)))
        finally:
            evaluator.close()
        points.append(point)
        if on_point:
            on_point(point)
    band = band_for(eval_config.device, config)
    return {
        "kind": "calibration",
        "what": "the reference Model timed against itself (the eager strategy), before the run",
        "device": eval_config.device,
        "timing": "quick" if config.quick else "full",
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": round(time.monotonic() - started, 1),
        "points": points,
        **judge_spread(points, band, config.max_off_fraction),
    }


def eager_spread(rows: Iterable, device: str, config: CalibrationConfig | None = None) -> dict | None:
    """The same judgement over a run's own eager candidates (identical code on every task it ran)."""
    config = config or CalibrationConfig()
    points = [{"task": r.task_name, "status": r.status, "raw_speedup": r.verdict.raw_speedup,
               "speedup": r.verdict.speedup} for r in rows if r.origin == "eager"]
    if not points:
        return None
    return {"kind": "eager", "what": "the run's eager candidates (the reference unchanged, timed as the run was)",
            **judge_spread(points, band_for(device, config), config.max_off_fraction, failures_are_noise=False)}


def point_line(point: dict) -> str:
    if point["status"] != "ok" or point.get("raw_speedup") is None:
        return f"{point['task']}: {point['status']}"
    ci = point.get("ci") or [None, None]
    interval = f", 95% CI {ci[0]:.3f}-{ci[1]:.3f}" if ci[0] is not None else ""
    return f"{point['task']}: identical code measured {point['raw_speedup']:.3f}x{interval}"


def verdict_text(result: dict) -> str:
    """One paragraph a user reads before trusting the numbers."""
    spread = (f"raw {result['raw_min']:.3f}-{result['raw_max']:.3f}x over {result['n_ok']} task(s)"
              if result.get("raw_min") is not None else f"no usable measurement over {result['n']} task(s)")
    if result["too_noisy"]:
        return (f"this host is too noisy to measure speedups: {'; '.join(result['reasons'])} ({spread}). "
                "Results of this run are marked as such; stop other work on the machine and rerun.")
    if not result.get("n_ok"):
        return (f"no noise check: none of {result['n']} identical-code evaluation(s) came out ok (their "
                "tasks' failures, shown with the run's results).")
    inside = result.get("n_ok", 0) - result.get("n_outside_band", 0)
    failed = (f" {result['n_failed']} identical-code evaluation(s) did not come out ok: their tasks' "
              "failures, shown with the run's results." if result.get("n_failed") else "")
    # "passed" allows a share outside the band (max_off_fraction): say how many were inside it
    return (f"noise check passed: identical code within 1 +- {result['band']:g} on {inside} of "
            f"{result.get('n_ok', 0)} task(s) ({spread})." + failed)


def save_calibration(out_dir: str | Path, result: dict) -> Path:
    """Append to OUT/calibration.json (a rerun keeps the earlier checks; reports show the latest)."""
    path = Path(out_dir) / CALIBRATION_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    history = load_calibrations(out_dir)
    history.append(result)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"checks": history}, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def load_calibrations(out_dir: str | Path) -> list[dict]:
    """The run directory's noise checks. A file that holds none this version can read (cut short, edited,
    not UTF-8, a directory in its place) is set aside as calibration.json.unreadable, not overwritten
    by the next check, and the run goes on as if it had none."""
    path = Path(out_dir) / CALIBRATION_NAME
    try:
        checks = json.loads(path.read_text(encoding="utf-8")).get("checks", [])
        if not isinstance(checks, list) or not all(map(_readable_check, checks)):
            raise ValueError("not a list of noise checks")
        return checks
    except (FileNotFoundError, PermissionError):  # none, or not this user's to read: nothing moved
        return []
    except (IsADirectoryError, ValueError, AttributeError, RecursionError):  # UnicodeDecodeError, JSON's too
        set_aside(path)  # an earlier one set aside stays too
        return []


# What the bench summary, the report's table and verdict_text read from a check.
_CHECK_FIELDS = {"device": str, "kind": str, "what": str, "too_noisy": bool, "n": int, "n_ok": int,
                 "band": (int, float), "n_outside_band": int, "n_scored_off": int}


def _readable_check(check) -> bool:
    try:
        return (all(isinstance(check[k], t) for k, t in _CHECK_FIELDS.items())
                and isinstance(verdict_text(check), str))
    except (TypeError, KeyError, ValueError, AttributeError, IndexError):
        return False
