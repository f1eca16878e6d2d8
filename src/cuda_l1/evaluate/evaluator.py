"""Evaluate candidates for a task: both sides sandboxed, timed by the parent, outputs read from outside.

    evaluator = Evaluator(task, EvalConfig(device="cuda"))
    verdict = evaluator.evaluate(candidate_source)        # any number of times
    evaluator.close()

The parent process (this one) owns the seeds, the inputs, the clock, every comparison and the
verdict. The reference runs in a sandboxed side of its own (kept for the task), each candidate in a
fresh one, both with the same harness (child.py); referee.py runs the rounds between them.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from typing import Callable

import torch

from cuda_l1.devices import normalize_device
from cuda_l1.errors import TaskError, UserError
from cuda_l1.evaluate import static_scan, timing
from cuda_l1.evaluate.build.requests import default_builder
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.device import device_name, gpu_healthy, versions
from cuda_l1.evaluate.fork_server import ForkedProcess
from cuda_l1.evaluate.lookahead import Preloaded
from cuda_l1.evaluate.protocol import Mapped, Release
from cuda_l1.evaluate.referee import Referee
from cuda_l1.evaluate.sandbox import ChildFailure
from cuda_l1.evaluate.sides import ReferenceFailure, load_side
from cuda_l1.evaluate.side_supply import SideSupply
from cuda_l1.evaluate.task_env import TaskEnv
from cuda_l1.evaluate.verdict import OK, RUNTIME_ERROR, TIMEOUT, Check, Verdict, clean_text
from cuda_l1.tasks import Task, code_id


def failed_at(exc: BaseException) -> str:
    """Where in this package an error of the evaluator itself was raised or passed last (" in
    referee.py:303 (measure)"): the reason names the place, so that a failure such as running out of
    device memory says which of the parent's own allocations it was, without its traceback."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename).startswith(package)]
    return f" in {os.path.basename(frames[-1].filename)}:{frames[-1].lineno} ({frames[-1].name})" if frames else ""


def prewarm_of(config: EvalConfig) -> bool:
    """Whether sides are started ahead: on a GPU unless told (on a CPU a warming side would compete
    with the timed calls for the cores)."""
    return config.prewarm if config.prewarm is not None else config.device.startswith("cuda")


def fresh_reference_of(config: EvalConfig) -> bool:
    """Whether each candidate meets a reference side started for it (config.fresh_reference)."""
    return config.fresh_reference if config.fresh_reference is not None else not config.device.startswith("cuda")


def needs_remeasure(verdict: Verdict, config: EvalConfig, best_known: float | None = None) -> bool:
    """The re-measure rule: a speedup above `remeasure_above`, or above `remeasure_vs_best` times the
    best known for the task, counts only after a second measurement in a fresh process agrees."""
    if verdict.status != OK or verdict.speedup is None:
        return False
    tc, best = config.timing, best_known if best_known is not None else config.best_known_speedup
    return verdict.speedup > tc.remeasure_above or bool(best and verdict.speedup > tc.remeasure_vs_best * best)


def merge_remeasure(first: Verdict, again: Verdict, where: str) -> Verdict:
    """Combine a suspicious verdict with its re-measurement: the lower speedup counts, and a second
    run that is not ok makes the whole verdict not ok. `where` says which process/device re-measured."""
    merged = dataclasses.replace(first, timing=dict(first.timing), checks=list(first.checks),
                                 reasons=list(first.reasons))
    if again.status != OK:
        merged.status, merged.speedup = again.status, None
        merged.reasons = [f"re-measurement in a fresh process ({where}) failed: " + "; ".join(again.reasons)]
        merged.checks += [c for c in again.checks if c.passed is False]
        return merged
    merged.timing["remeasured"] = {"speedup": again.speedup, "raw_speedup": again.raw_speedup, "ci": again.ci,
                                   "reference_ms": again.reference_ms, "candidate_ms": again.candidate_ms,
                                   "device": again.device, "where": where}
    if again.speedup is not None and (merged.speedup is None or again.speedup < merged.speedup):
        merged.speedup, merged.raw_speedup, merged.ci = again.speedup, again.raw_speedup, again.ci
        merged.reference_ms, merged.candidate_ms = again.reference_ms, again.candidate_ms
    return merged


IGNORES_INPUTS = ("the reference's outputs were the same for two draws of its inputs: they do not depend on them, "
                  "so a candidate returning a constant is correct on this task (the task's doing, not the candidate's)")


def judge_device_health(verdict: Verdict, healthy: bool, note: str, device_fault: bool) -> None:
    """Record the parent's health check of the GPU after a failed evaluation. A device fault met reading
    the candidate's memory is the candidate's refusal only while the device itself is healthy: where the
    whole device failed, the evaluation failed (runtime_error), not the candidate."""
    verdict.checks.append(Check("gpu_health_after", healthy, note, blocking=False))
    if device_fault and not healthy:
        verdict.status = RUNTIME_ERROR
        verdict.reasons.insert(0, "the GPU itself failed a health check after the reference's side faulted: "
                                  "the evaluation failed, not the candidate")


class Evaluator:
    """Evaluates any number of candidates for one task; the reference's side is prepared once."""

    def __init__(self, task: Task, config: EvalConfig | None = None, build: Callable | None = None,
                 supply: SideSupply | None = None):
        """`supply`: fresh sides shared with other evaluators (a worker's); by default its own."""
        config = dataclasses.replace(config or EvalConfig())  # the caller's config is never changed
        config.device = normalize_device(config.device)
        if config.device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError("--device cuda was asked for, but no CUDA device is visible; use --device cpu.")
        if config.threads is None and config.device == "cpu":
            # Two alternating processes on one core: one thread each gives comparable numbers.
            config.threads = 1
        if config.threads:
            torch.set_num_threads(config.threads)
        self.config = config
        self.task = task
        self.build = build if build is not None else default_builder(config)
        self.own_supply = supply is None
        self.supply = supply if supply is not None else SideSupply(prewarm_of(config), spares=1)
        try:
            self.env = TaskEnv(task, config, self.build, self.supply)  # a broken reference raises TaskError
        except BaseException:
            if self.own_supply:  # its spare sides go with it
                self.supply.close()
            raise
        self._setup_reported = False

    def preload(self, source: str) -> Preloaded:
        """Start a side for `source` and load it, to be evaluated later (`evaluate(preloaded=...)`).
        Meant for a helper thread while the worker times another candidate (lookahead.py): the side
        works in the background, stopped for every timed window, and is stopped when done; the
        thread holds the supply's gate for every step but its waits. Never raises: a failure is kept
        for the evaluation to report. Call it from a thread that outlives the side: a side's
        parent-death signal fires when the thread that started it ends."""
        ahead = Preloaded(source, time.monotonic())
        env, cfg = self.env, self.config
        t0 = time.perf_counter()
        try:
            with self.supply.gate:  # taken and tracked at once: no window runs between the two
                ahead.proc = env.start_side()
                self.supply.track(ahead.proc)
            ahead.start_side_s = time.perf_counter() - t0
            with self.supply.gate:
                ahead.proc.allow_memory(env.note_reference_memory())
            setup = env.candidate_setup(source)
            limit = min(cfg.load_timeout_s, cfg.timeout_s)
            ahead.loaded = load_side(ahead.proc, setup, limit, self.build, gate=self.supply.gate)
            with self.supply.gate:
                stop_failure = self.supply.untrack(ahead.proc)
                if stop_failure is not None:
                    raise stop_failure
                ahead.proc.freeze()  # nothing it started may run until its evaluation thaws it
        except BaseException as exc:  # noqa: BLE001 - reported by the evaluation
            if ahead.proc is not None:
                with self.supply.gate:  # its verdict is decided: nothing of it runs on
                    exc = self.supply.untrack(ahead.proc) or exc
                    ahead.proc.kill("its load failed")
            ahead.loaded, ahead.failure = None, exc
        ahead.load_s = time.perf_counter() - t0 - ahead.start_side_s
        return ahead

    def evaluate(self, source: str, remeasure: bool = True, thresholds: tuple[float, ...] = (),
                 preloaded: Preloaded | None = None) -> Verdict:
        """One verdict. `thresholds`: speedups the caller decides at (bucket edges, the best so far);
        timing may stop as soon as the interval is clear of all of them. `preloaded`: the candidate's
        side as `preload(source)` left it."""
        if preloaded is not None and preloaded.source != source:
            preloaded.discard()
            raise ValueError("a preloaded side is for another source")
        verdict = self._evaluate_once(source, thresholds, preloaded)
        if remeasure and self.config.remeasure and needs_remeasure(verdict, self.config):
            # Both sides in fresh processes: a per-process effect on either one (where its memory
            # landed; on the 2-core CPU host once, a reference side 2.3x slow for a whole evaluation
            # of identical code) must not be carried into the measurement that confirms the first.
            self.env.restart_reference()
            verdict = merge_remeasure(verdict, self._evaluate_once(source, thresholds),
                                      f"same device, {self.config.device}")
            verdict.timing["remeasured"]["reference"] = "a fresh process"
        return verdict

    def _evaluate_once(self, source: str, thresholds: tuple[float, ...] = (),
                       ahead: Preloaded | None = None) -> Verdict:
        started = ahead.started if ahead is not None else time.monotonic()
        config, env = self.config, self.env
        verdict = Verdict(status=RUNTIME_ERROR, device=device_name(config.device), versions=versions(config.device),
                          task_id=self.task.id, task_name=self.task.key, candidate_id=code_id(source))
        findings = static_scan.scan(source)
        device_fault = False  # the reference's side faulted reading memory the candidate named
        if ahead is not None and ahead.proc is None:  # no side could be started for it
            failure = ahead.failure
            raise failure if isinstance(failure, (TaskError, UserError)) else RuntimeError(
                f"no side could be started for the candidate: {failure}")
        reference_start_s = None
        if env.ref is None:  # (the task's first, or a fresh one for each candidate: _settle_reference)
            reference_start_s = time.perf_counter()
            try:
                env.start_reference()
            except BaseException:
                if ahead is not None:  # its side, loaded and stopped, would wait for the worker's end
                    ahead.discard()
                raise
            reference_start_s = time.perf_counter() - reference_start_s
        side_started = time.perf_counter()
        cand = ahead.proc if ahead is not None else env.start_side()
        waited = dict(env.supply.waited)  # what this evaluation's windows wait for (below)
        # The reference's start is not the candidate's time.
        deadline = started + config.timeout_s + (reference_start_s or 0.0)
        referee = Referee(env, cand, source, config, deadline=deadline, thresholds=thresholds)
        referee.phases["start_side"] = (ahead.start_side_s if ahead is not None  # a spare's hand-over, or a start
                                        else time.perf_counter() - side_started)
        if reference_start_s is not None and self._setup_reported:  # (the first's: the task's setup phases)
            referee.phases["start_reference"] = reference_start_s
        if ahead is not None:
            referee.phases["load"] = ahead.load_s  # beside the windows of the candidates before it
        try:
            if ahead is not None and ahead.failure is not None:
                raise ahead.failure
            with referee.phase("load" if ahead is None else "load_resume"):
                loaded = referee.load(ahead.loaded if ahead is not None else None)
            if loaded:
                referee.measure()
        except ChildFailure as failure:
            referee._fail(getattr(failure, "check", "runs_to_completion"), failure.kind, str(failure))
            referee.status = failure.kind
        except ReferenceFailure as failure:
            device_fault = failure.device_fault  # (output_checks._verified: memory it named faulted)
            beside = "" if device_fault else " (the candidate was running beside it)"
            referee._fail(failure.check, failure.kind, f"{failure}{beside}")
            referee.status = failure.kind
            # Ended, never reused (its context may be lost: reference_checks._context_lost); the next
            # evaluation starts a new one. A restart here that failed would lose this verdict (ending it
            # raises no device error: TaskEnv.close_reference; the health check below reports the device).
            # Under the gate: a helper thread loading the next candidate reads the side's memory.
            with self.supply.gate:
                env.close_reference(graceful=False)
        except (TaskError, UserError):
            raise
        except Exception as exc:  # noqa: BLE001 - the evaluator never ends an evaluation with a traceback
            referee._fail("evaluator", RUNTIME_ERROR,
                          f"the evaluation failed{failed_at(exc)}: {type(exc).__name__}: {exc}")
            referee.status = RUNTIME_ERROR
            verdict.timing["evaluator_error"] = traceback.format_exc()[-3000:]
        finally:
            with referee.phase("teardown"):  # its parts too: what ending a side costs on the critical path
                with referee.phase("teardown.side"):
                    if referee.cand is not None:
                        referee.cand.memory.close()
                    log = cand.close(graceful=referee.status is None)
                with referee.phase("teardown.buffers"):
                    if referee.cand is not None:
                        try:
                            referee.cand.buffer.close()
                            if referee.cand.ring is not None:
                                referee.cand.ring.close()
                        except RuntimeError as exc:  # the parent's device calls failed: a verdict, not a traceback
                            referee._fail("evaluator", RUNTIME_ERROR, f"the candidate's input buffer could not be "
                                                                      f"given back: {type(exc).__name__}: {exc}"[:600])
                # the reference's own harness work per call (timing.resolution_note's floor of a measured call),
                # read before its side may end (_settle_reference)
                harness = env.ref.harness_per_call if env.ref is not None else ()
                with referee.phase("teardown.reference"):
                    self._settle_reference()
        checks = list(referee.checks.values())
        checks.append(Check("static_scan", not findings, static_scan.summary(findings), blocking=False))
        # Reasons, details and the log may carry text the candidate wrote (exception messages, prints).
        verdict.checks = [dataclasses.replace(c, detail=clean_text(c.detail)) for c in checks]
        verdict.reasons, verdict.log = [clean_text(r) for r in referee.reasons], clean_text(log)
        verdict.sandbox = dict(cand.notes)
        verdict.sandbox["started"] = "forked" if isinstance(cand.proc, ForkedProcess) else "fresh interpreter"
        if isinstance(cand.proc, ForkedProcess) and cand.proc.server.preloaded:
            verdict.sandbox["preloaded"] = ", ".join(cand.proc.server.preloaded)
        if env.ignores_inputs:
            verdict.checks.append(Check("reference_uses_inputs", False, IGNORES_INPUTS, blocking=False))
        verdict.sandbox["memory"] = {"limit_bytes": cand.memory_limit, "peak_bytes": cand.peak_memory,
                                     "reference_peak_bytes": env.reference_peak}
        if referee.builds:
            verdict.timing["builds"] = referee.builds
        if referee.status is not None:
            verdict.status = referee.status
            if config.device.startswith("cuda") and (referee.status in (RUNTIME_ERROR, TIMEOUT) or device_fault):
                with referee.phase("gpu_health"):
                    healthy, note = gpu_healthy(config.device)
                judge_device_health(verdict, healthy, note, device_fault)
        elif referee.estimate is None:  # timing disabled: correct, not timed
            verdict.status = OK
            verdict.timing = {**referee.timing, **verdict.timing}
        else:
            est = referee.estimate
            verdict.status = OK
            verdict.raw_speedup, verdict.ci = est.point, [est.lo, est.hi]
            verdict.reference_ms, verdict.candidate_ms = est.reference_ms, est.candidate_ms
            # Unmeasured windows can only lower a score: a slow candidate that made the reference's windows
            # unresolved (by forcing one call a window, say) keeps the score its own windows earn.
            verdict.speedup = est.score if referee.unresolved is None else min(est.score, 1.0)
            if config.device == "cpu":  # a CPU window's loop is the side's own: what skipping it could save
                harness_s = timing.harness_call_s(harness)
                capped = timing.harness_cap(verdict.speedup, est.reference_ms, est.candidate_ms, harness_s)
                if capped < verdict.speedup:
                    verdict.timing["harness_cap"] = {"score": round(verdict.speedup, 4), "harness_us": round(harness_s * 1e6, 2)}
                verdict.speedup = capped
            verdict.timing = {**referee.timing, **verdict.timing}
            # `ci` holds the spread between processes too (timing.estimate); the rounds' own interval:
            verdict.timing["ci_within_rounds"] = [est.within_lo, est.within_hi]
            verdict.timing["process_spread"] = referee.spread
            share = env.launch_share  # what moved the spread on a GPU (launch_share.py)
            verdict.timing["launch_share"] = round(share, 3) if share is not None else None
            verdict.timing["reference_harness_us"] = round(timing.harness_call_s(harness) * 1e6, 2) if harness else None
        # Where the time went, for every verdict (a timed one's report holds the same, taken earlier).
        verdict.timing["phases_s"] = {k: round(v, 3) for k, v in referee.phases.items()}
        verdict.timing["phases_s"].update({f"verify.{k}": round(v, 3) for k, v in referee.verify_spent.items()})
        verdict.timing["phases_s"].update({f"windows.{k}_wait": round(v - waited.get(k, 0.0), 3)
                                           for k, v in env.supply.waited.items()})
        if env.setup_phases and not self._setup_reported:  # the task's own preparation, once
            verdict.timing["phases_s"].update({f"task.{k}": round(v, 3) for k, v in env.setup_phases.items()})
            self._setup_reported = True
        verdict.elapsed_s = time.monotonic() - started
        return verdict

    def _settle_reference(self) -> None:
        """The reference's side ends every evaluation stopped, holding nothing of the candidate (or is
        restarted if it is not healthy). With fresh_reference (a CPU's default) it ends instead: on the
        2-core CPU hosts a side that had served earlier candidates read 2.5-10% faster than a new one
        running identical code (the state of its process; where its memory lies is the likely part),
        so each candidate meets a reference side as new as its own."""
        ref = self.env.ref
        if ref is None:
            return
        if ref.proc.exit_info().reason != "running":
            self.env.close_reference()
            return
        if fresh_reference_of(self.config):
            with self.supply.gate:  # (a helper thread loading the next candidate reads its memory under it)
                self.env.close_reference(graceful=False)  # nothing of it is kept: no need to wait for its exit
            return
        try:
            if self.config.device.startswith("cuda"):  # close the candidate's handles it opened
                ref.proc.thaw()
                ref.proc.request(Release(), self.config.call_timeout_s, Mapped)
            ref.proc.freeze()
        except ChildFailure:
            self.env.close_reference()

    def close(self) -> None:
        """Stop the spare and the reference's side (also done when the evaluator is garbage-collected)."""
        if getattr(self, "supply", None) is not None and self.own_supply:
            self.supply.close()
        if getattr(self, "env", None) is not None:
            self.env.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def evaluate(task: Task, source: str, config: EvalConfig | None = None) -> Verdict:
    evaluator = Evaluator(task, config)
    try:
        return evaluator.evaluate(source)
    finally:
        evaluator.close()
