"""Evaluate candidates for a task: load in a sandbox, check on secret inputs, time in alternation.

    verdict = evaluate(task, candidate_source, EvalConfig(device="cuda"))
    verdicts = evaluate_many(task, [src1, src2, ...], config)   # reference prepared once

The parent process (this one) owns the reference, its outputs, all statistics and the verdict. The
candidate runs only in a child (sandbox.py / child.py).
"""

from __future__ import annotations

import dataclasses
import os
import random
import secrets
import statistics
import time
from typing import Callable, Iterable

import torch

from cuda_l1.evaluate import static_scan
from cuda_l1.evaluate.builder import build_cache_dir
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.device import Telemetry, device_name, gpu_healthy, normalize_device, versions
from cuda_l1.evaluate.judge import judge_check, judge_full, judge_spots
from cuda_l1.evaluate.precision import spot_bound
from cuda_l1.evaluate.reference import PreparedReference
from cuda_l1.evaluate.sandbox import ChildFailure, ChildProcess
from cuda_l1.evaluate.stats import conservative_speedup, speedup_ci, summarize
from cuda_l1.evaluate.verdict import (COMPILE_ERROR, INCORRECT, OK, REJECTED, RUNTIME_ERROR, TIMEOUT, Check,
                                      Verdict)
from cuda_l1.tasks import Task, source_id

# Order in which a failing check decides the status when several fail at once.
_SEVERITY = {REJECTED: 0, INCORRECT: 1}


def _leaf_bytes(leaves: list) -> list[int]:
    return [leaf.numel() * leaf.element_size() for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _max_reply_bytes(leaves: list) -> int:
    return 4 * sum(_leaf_bytes(leaves)) + (64 << 20)


def _timing_core(config: EvalConfig) -> int | None:
    """The core both sides are timed on: CPU device with one thread, where the platform can pin."""
    if config.device != "cpu" or (config.threads or 1) != 1 or not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if config.cpu_core is not None:
        return config.cpu_core if config.cpu_core in allowed else None
    return allowed[0] if allowed else None


def _low_quantile(values: list[float]) -> float:
    """The first quintile (the minimum of fewer than five values)."""
    return statistics.quantiles(values, n=5)[0] if len(values) >= 5 else min(values)


def _spread(values: list[float]) -> float:
    """Fourth quintile minus first: how much round-trip latency varies (0 with fewer than five values)."""
    if len(values) < 5:
        return 0.0
    quintiles = statistics.quantiles(values, n=5)
    return quintiles[3] - quintiles[0]


class CandidateRun:
    """One candidate through one child: load, correctness, timing. Fills a Verdict."""

    def __init__(self, ref: PreparedReference, source: str, config: EvalConfig, build: Callable | None):
        self.ref = ref
        self.source = source
        self.config = config
        self.build = build
        self.checks: dict[str, Check] = {}
        self.reasons: list[str] = []
        self.status: str | None = None
        self.timing: dict = {}
        self.sandbox_report: dict = {}
        self.builds: list[dict] = []  # extension builds the candidate asked for (timing, cache hits)
        self.rng = random.Random(secrets.randbits(64))

    def _check(self, name: str, passed: bool | None, detail: str = "", blocking: bool = True) -> None:
        previous = self.checks.get(name)
        if previous is not None and previous.passed is False:
            return  # the first failure of a check is the informative one
        self.checks[name] = Check(name, passed, detail, blocking)

    def _fail(self, name: str, status: str, reason: str) -> None:
        self._check(name, False, reason)
        self.reasons.append(reason)
        if self.status is None or _SEVERITY.get(status, -1) < _SEVERITY.get(self.status, -1):
            self.status = status

    # -- phases ----------------------------------------------------------------------------------
    def load(self, child: ChildProcess) -> bool:
        cfg = self.config
        child.send({
            "op": "setup",
            "device": cfg.device,
            "reference_source": self.ref.task.source,
            "candidate_source": self.source,
            "init_seed": self.ref.init_seed,
            "threads": cfg.threads or torch.get_num_threads(),
            "cpu_core": _timing_core(cfg),
            "flush_bytes": self.ref.flusher.buffer.numel() * 4 if self.ref.flusher and self.ref.flusher.buffer is not None else 0,
            "landlock": cfg.sandbox.landlock,
            "read_paths": [str(build_cache_dir(cfg))],
            "limits": {
                "cpu_s": cfg.sandbox.cpu_seconds,
                "file_bytes": cfg.sandbox.file_bytes,
                "open_files": cfg.sandbox.open_files,
                "address_space_bytes": cfg.sandbox.memory_bytes if cfg.device == "cpu" else None,
                "processes": cfg.sandbox.max_processes,
            },
        })
        deadline = time.monotonic() + cfg.load_timeout_s
        confined = False
        while True:
            msg = child.recv(max(deadline - time.monotonic(), 0.01), max_bytes=16 << 20)
            op = msg.header.get("op")
            if op == "build":
                if not confined:
                    raise ChildFailure(RUNTIME_ERROR, "a build was requested before confinement was reported")
                started = time.monotonic()
                reply = self.build(msg.header) if self.build else {"ok": False, "log": "no builder"}
                self.builds.append({"ok": reply.get("ok"), "cached": reply.get("cached"),
                                    "seconds": round(time.monotonic() - started, 3)})
                child.send(reply)
                continue
            if op == "confined":
                if confined:  # only the report sent before the candidate was imported counts
                    raise ChildFailure(RUNTIME_ERROR, "a second confinement report arrived: protocol violated")
                confined = True
                report = msg.header.get("sandbox")
                self.sandbox_report = report if isinstance(report, dict) else {}
                child.notes = {k: str(v) for k, v in self.sandbox_report.items()}
                continue
            if op != "loaded":
                raise ChildFailure(RUNTIME_ERROR, f"unexpected message {op!r} while loading")
            break
        h = msg.header
        if not h.get("ok"):
            kind = h.get("kind")
            message = str(h.get("message", ""))[-4000:]
            if kind == "compile_error":
                self._fail("compiles", COMPILE_ERROR, "the candidate does not load: " + message)
                self.status = COMPILE_ERROR
            elif kind == "harness_error":
                raise RuntimeError("the evaluation harness could not start in the child:\n" + message)
            else:
                self._check("compiles", True, "module imported")
                self._fail("constructs", RUNTIME_ERROR, message)
                self.status = RUNTIME_ERROR
            return False
        self._check("compiles", True, "module imported, ModelNew found")
        self._check("constructs", True, "ModelNew(*get_init_inputs()) built")
        if h.get("state_changes"):
            self._fail("global_state", REJECTED,
                       "importing the candidate patched guarded functions or precision settings: "
                       + ", ".join(map(str, h["state_changes"])))
            return False
        return True

    def _lingering(self, child: ChildProcess, header: dict, baseline_threads: int) -> None:
        python_threads = header.get("python_threads")
        tree = child.tree()
        # Helper threads of installed libraries (reported by the harness) are not the candidate's work.
        allowed = min(int(header.get("library_threads") or 0), 4)
        extra = tree["threads"] - baseline_threads - allowed
        if python_threads:
            self._fail("no_lingering_work", REJECTED,
                       f"threads started by the candidate are still running after a call: {python_threads[:4]}")
        elif extra > 0:
            self._fail("no_lingering_work", REJECTED,
                       f"{extra} native thread(s) started by the candidate are still running after a call")
        if tree["processes"]:
            self._fail("no_lingering_work", REJECTED,
                       f"processes started by the candidate are still running: {tree['processes'][:4]}")

    def correctness(self, child: ChildProcess) -> bool:
        cfg = self.config
        baseline = child.tree()["threads"]
        self.comparisons = []
        for trial in range(cfg.correctness_trials):
            same = trial % 2 == 1  # odd trials reuse the previous buffers with new values
            entry = self.ref.correctness_set(trial, with_oracle=cfg.tolerance.mode == "oracle")
            seed, structure, oracle, digest = entry["seed"], entry["structure"], entry["oracle"], entry["digest"]
            ref_leaves = entry["device_leaves"]
            timeout = cfg.first_call_timeout_s if trial == 0 else cfg.call_timeout_s
            reply = child.request({"op": "check", "seed": seed, "same_buffers": same,
                                   "poison_bytes": _leaf_bytes(ref_leaves)}, timeout, _max_reply_bytes(ref_leaves))
            if not reply.header.get("ok"):
                self._fail("forward_runs", RUNTIME_ERROR, "forward raised:\n" + str(reply.header.get("message", ""))[-4000:])
                self.status = RUNTIME_ERROR
                return False
            judgement = judge_check(reply, structure, ref_leaves, oracle, digest, cfg.tolerance)
            for finding in judgement.findings:
                self._fail(finding.check, finding.status, f"input set {trial + 1}: {finding.reason}")
            self.comparisons += judgement.comparisons
            if reply.header.get("state_changes"):
                self._fail("global_state", REJECTED, "the candidate patched guarded functions or precision settings: "
                           + ", ".join(map(str, reply.header["state_changes"])))
            self._lingering(child, reply.header, baseline)
            if self.status is not None:
                return False
        self._check("forward_runs", True, f"{cfg.correctness_trials} calls")
        for name in ("output_structure", "output_type", "dtype", "shape", "device", "strides", "no_input_aliasing",
                     "output_ownership", "input_provenance", "inputs_unchanged", "global_state", "no_lingering_work"):
            self._check(name, True)
        worst = max(self.comparisons, key=lambda c: c.candidate_error / c.allowed_error if c.allowed_error else 0,
                    default=None)
        oracle_note = "" if self.ref.oracle_device else " (no float64 oracle: kernelbench tolerance)"
        self._check("correctness", True, f"{cfg.correctness_trials} input sets; worst: {worst.detail if worst else 'n/a'}{oracle_note}")
        self.baseline_threads = baseline
        return True

    def measure(self, child: ChildProcess) -> None:
        core = _timing_core(self.config)
        if core is None:
            return self._measure(child)
        # Both processes on one core (the child pinned itself at setup): they alternate, never overlap,
        # and see the same caches and clock instead of whichever core the scheduler picked.
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {core})
        try:
            return self._measure(child)
        finally:
            os.sched_setaffinity(0, allowed)

    def _measure(self, child: ChildProcess) -> None:
        cfg, tc = self.config, self.config.timing
        telemetry = Telemetry(cfg.device)
        bound = spot_bound(self.comparisons)
        before = telemetry.read()
        pings = [self._ping(child) for _ in range(5)]

        ref_ev, ref_wall, ref_rt, cand_ev, cand_wall, cand_rt, fetched_rounds = [], [], [], [], [], [], set()
        prev_ref_leaves, prev_positions, prev_fetch = None, None, False
        started, warm_calls, round_no = time.monotonic(), 0, 0
        warm = False
        while True:
            seed = secrets.randbits(62)
            same = self.rng.random() < tc.same_buffer_fraction
            t0 = time.perf_counter()
            ref_leaves, ref_time = self.ref.time_once(seed, same)
            rt_ref = (time.perf_counter() - t0) * 1e3
            request = {"op": "time", "seed": seed, "same_buffers": same, "spots": prev_positions,
                       "fetch_previous": prev_fetch}
            t0 = time.perf_counter()
            reply = child.request(request, cfg.call_timeout_s, _max_reply_bytes(ref_leaves))
            rt_cand = (time.perf_counter() - t0) * 1e3
            self._judge_timed(reply, prev_ref_leaves, prev_positions, bound)
            if self.status is not None:
                return
            if warm:
                # Pings at unpredictable rounds sample the round-trip latency the timed calls see: on a
                # busy host it grows for every message, honest or not.
                if self.rng.random() < tc.ping_fraction:
                    pings.append(self._ping(child))
                ref_ev.append(ref_time.event_ms)
                ref_wall.append(ref_time.wall_ms)
                ref_rt.append(rt_ref)
                cand_ev.append(reply.header.get("event_ms"))
                cand_wall.append(float(reply.header.get("wall_ms", 0.0)))
                cand_rt.append(rt_cand)
                if prev_fetch:
                    fetched_rounds.add(len(cand_rt) - 1)
                round_no += 1
            else:
                warm_calls += 1
                if warm_calls >= tc.min_warmup_calls and time.monotonic() - started >= tc.warmup_s:
                    warm, started = True, time.monotonic()
            # Positions and the full-fetch decision for this round are drawn now, after the call returned.
            prev_ref_leaves = ref_leaves
            prev_positions = [[self.rng.randrange(1 << 40) for _ in range(tc.spot_checks)]
                              if isinstance(leaf, torch.Tensor) and leaf.numel() else [] for leaf in ref_leaves]
            # Full fetches are costly for large outputs: about `full_checks` of them over a typical run.
            prev_fetch = warm and self.rng.random() < tc.full_checks / max(2 * tc.min_rounds, 60)
            if warm and round_no >= tc.min_rounds:
                primary_ref = ref_ev if ref_ev[0] is not None else ref_wall
                primary_cand = cand_ev if cand_ev[0] is not None else cand_wall
                done = (summarize(primary_ref).rse <= tc.target_rse and summarize(primary_cand).rse <= tc.target_rse)
                if done or round_no >= tc.max_rounds or time.monotonic() - started >= tc.max_time_s:
                    break
        final = child.request({"op": "time", "final": True, "spots": prev_positions, "fetch_previous": True},
                              cfg.call_timeout_s, _max_reply_bytes(prev_ref_leaves))
        self._judge_timed(final, prev_ref_leaves, prev_positions, bound, full=True)
        if final.header.get("state_changes"):
            self._fail("global_state", REJECTED, "the candidate patched guarded functions during timing: "
                       + ", ".join(map(str, final.header["state_changes"])))
        self._lingering(child, final.header, self.baseline_threads)
        if self.status is not None:
            return
        self._check("timed_outputs", True, f"{round_no} timed calls spot-checked at {tc.spot_checks} positions, "
                    f"{len(fetched_rounds) + 1} checked in full")
        after = telemetry.read()
        self._finish_timing(ref_ev, ref_wall, ref_rt, cand_ev, cand_wall, cand_rt, fetched_rounds, pings,
                            {"before": before, "after": after})

    def _ping(self, child: ChildProcess) -> float:
        t0 = time.perf_counter()
        child.request({"op": "ping"}, self.config.call_timeout_s)
        return (time.perf_counter() - t0) * 1e3

    def _judge_timed(self, reply, prev_ref_leaves, positions, bound, full: bool = False) -> None:
        h = reply.header
        if not h.get("ok"):
            self._fail("forward_runs", RUNTIME_ERROR, "a timed call raised:\n" + str(h.get("message", ""))[-4000:])
            self.status = RUNTIME_ERROR
            return
        if h.get("python_threads"):
            self._fail("no_lingering_work", REJECTED, f"threads still running after a timed call: {h['python_threads'][:4]}")
        previous = h.get("previous") or {}
        if prev_ref_leaves is None:
            return
        problem = judge_spots(previous.get("spots") or [], prev_ref_leaves, positions or [], bound)
        if problem:
            self._fail("timed_outputs", INCORRECT, problem)
            return
        if "metas" in previous:
            wrong = judge_full(previous["metas"], reply.blobs, prev_ref_leaves, bound)
            if wrong:
                self._fail("timed_outputs", *wrong)

    def _finish_timing(self, ref_ev, ref_wall, ref_rt, cand_ev, cand_wall, cand_rt, fetched, pings, telemetry):
        tc = self.config.timing
        ipc_ms = _low_quantile(pings)
        use_events = ref_ev and ref_ev[0] is not None and all(x is not None for x in cand_ev)
        hidden_work = False
        if use_events:
            ref_gap = statistics.median(w - e for w, e in zip(ref_wall, ref_ev))
            cand_gap = statistics.median(w - e for w, e in zip(cand_wall, cand_ev))
            threshold = max(tc.hidden_work_ms, 0.05 * statistics.median(cand_ev))
            hidden_work = cand_gap - ref_gap > threshold
            self._check("no_side_work", not hidden_work,
                        (f"device-wide sync waited {cand_gap - ref_gap:.3f} ms longer than the reference: work was left "
                         "on other streams, so both sides are timed in full (wall clock to device idle)")
                        if hidden_work else "all work finished on the harness stream", blocking=False)
        ref_ms = ref_ev if use_events and not hidden_work else ref_wall
        cand_ms = cand_ev if use_events and not hidden_work else cand_wall
        # The parent's own clock bounds what the child reports: extra round-trip time that the
        # reference side does not show means the reported times are too small.
        rounds = [i for i in range(len(cand_rt)) if i not in fetched]
        excess = None
        if rounds:
            # The same low quantile of the candidate's extra round-trip time and of the pings taken
            # during the rounds: tampering shifts every round, while the latency of a busy host shows
            # in both and cancels.
            cand_over = _low_quantile([cand_rt[i] - cand_wall[i] for i in rounds])
            ref_over = statistics.median(ref_rt[i] - ref_wall[i] for i in rounds)
            excess = cand_over - ref_over - ipc_ms
            # Input generation and cache flushing happen outside the timed window on both sides; their
            # jitter (large on a busy CPU host, small on a GPU) widens the allowance, and so does the
            # spread of the pings: on a crowded host a message can wait a whole scheduler slice.
            slack = (tc.consistency_slack_ms + 0.5 * statistics.median(cand_wall) + 0.5 * max(ref_over, 0.0)
                     + _spread(pings))
            if excess > slack:
                self._fail("timing_consistency", REJECTED,
                           f"the parent's clock saw {excess:.2f} ms per call more than the candidate reported "
                           f"(allowed {slack:.2f} ms): the timing was tampered with")
                return
        self._check("timing_consistency", True,
                    f"parent round-trip agrees with reported times (excess {excess:.3f} ms, allowed {slack:.2f} ms)"
                    if excess is not None else "")
        point, lo, hi = speedup_ci(ref_ms, cand_ms, seed=self.rng.randrange(1 << 30))
        ref_s, cand_s = summarize(ref_ms), summarize(cand_ms)
        throttled = any(t.get("throttled") for t in telemetry.values() if t)
        self.timing = {
            "protocol": "alternating rounds, fresh inputs, cache flushed, "
                        + ("CUDA events" if use_events and not hidden_work else "wall clock to device idle"),
            "reference": ref_s.to_dict(),
            "candidate": cand_s.to_dict(),
            "rounds": len(cand_ms),
            "ipc_ms": ipc_ms,
            "overhead_excess_ms": excess,
            "hidden_work": hidden_work,
            "telemetry": telemetry,
            "throttled": throttled,
            "ci_level": 0.95,
            "threads": torch.get_num_threads(),
        }
        self.raw = (point, lo, hi, ref_s.median_ms, cand_s.median_ms)


class ChildSupply:
    """Hands out fresh sandboxed children. With pre-warming, a spare child is started ahead of time so
    that its interpreter start, torch import and CUDA context creation overlap the previous candidate's
    evaluation; every candidate still gets a brand-new process."""

    def __init__(self, config: EvalConfig):
        self.config = config
        self.prewarm = config.prewarm if config.prewarm is not None else config.device.startswith("cuda")
        self.spare: ChildProcess | None = None

    def _start(self) -> ChildProcess:
        return ChildProcess.start(self.config.sandbox, device=self.config.device)

    def take(self) -> ChildProcess:
        child = self.spare if self.spare is not None and self.spare.exit_info().reason == "running" else None
        if child is None and self.spare is not None:
            self.spare.close(graceful=False)
        self.spare = None
        if child is None:
            child = self._start()
        if self.prewarm:
            self.spare = self._start()
        return child

    def close(self) -> None:
        if self.spare is not None:
            self.spare.close(graceful=False)
            self.spare = None


def _run_child(ref: PreparedReference, source: str, config: EvalConfig, build,
               supply: ChildSupply | None = None) -> tuple[CandidateRun, str]:
    run = CandidateRun(ref, source, config, build)
    child = supply.take() if supply is not None else ChildProcess.start(config.sandbox, device=config.device)
    try:
        if run.load(child) and run.correctness(child) and config.timing.enabled:
            run.measure(child)
    except ChildFailure as failure:
        run._fail("runs_to_completion", failure.kind, str(failure))
        run.status = failure.kind
    finally:
        log = child.close(graceful=run.status is None)
    return run, log


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


def _evaluate_prepared(ref: PreparedReference, source: str, config: EvalConfig, build,
                       supply: ChildSupply | None = None, remeasure: bool = True) -> Verdict:
    started = time.monotonic()
    device = config.device
    verdict = Verdict(status=RUNTIME_ERROR, device=device_name(device), versions=versions(device),
                      task_id=ref.task.id, task_name=ref.task.key, candidate_id=source_id(source))
    findings = static_scan.scan(source)
    run, log = _run_child(ref, source, config, build, supply)
    checks = list(run.checks.values())
    checks.append(Check("static_scan", not findings, static_scan.summary(findings), blocking=False))
    verdict.checks, verdict.reasons, verdict.log, verdict.sandbox = checks, run.reasons, log, run.sandbox_report
    if run.builds:
        verdict.timing["builds"] = run.builds
    if run.status is not None:
        verdict.status = run.status
        if device.startswith("cuda") and run.status in (RUNTIME_ERROR, TIMEOUT):
            healthy, note = gpu_healthy(device)
            verdict.checks.append(Check("gpu_health_after", healthy, note, blocking=False))
    elif not config.timing.enabled:
        verdict.status = OK
    else:
        point, lo, hi, ref_ms, cand_ms = run.raw
        verdict.status = OK
        verdict.raw_speedup, verdict.ci = point, [lo, hi]
        verdict.reference_ms, verdict.candidate_ms = ref_ms, cand_ms
        verdict.speedup = conservative_speedup(point, lo, hi)
        verdict.timing = {**run.timing, **({"builds": run.builds} if run.builds else {})}
        if remeasure and config.remeasure and needs_remeasure(verdict, config):
            again = _evaluate_prepared(ref, source, config, build, supply, remeasure=False)
            verdict = merge_remeasure(verdict, again, f"same device, {device}")
    verdict.elapsed_s = time.monotonic() - started
    return verdict


class Evaluator:
    """Evaluates any number of candidates for one task, preparing the reference once."""

    def __init__(self, task: Task, config: EvalConfig | None = None, build: Callable | None = None):
        self.config = config or EvalConfig()
        self.config.device = normalize_device(self.config.device)
        if self.config.device.startswith("cuda") and not torch.cuda.is_available():
            from cuda_l1.errors import UserError

            raise UserError("--device cuda was asked for, but no CUDA device is visible; use --device cpu.")
        if self.config.threads is None and self.config.device == "cpu":
            # Multi-threaded CPU timing in two alternating processes measures OpenMP barrier waits and
            # spinning workers more than the code; one thread each gives comparable numbers.
            self.config.threads = 1
        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        if self.config.device == "cpu":
            from cuda_l1.evaluate.timer import steady_host_allocator

            steady_host_allocator()  # the same policy as every CPU child (see timer.py)
        self.task = task
        self.reference = PreparedReference(task, self.config.device, flush_cache=self.config.timing.flush_cache)
        if build is None:
            from cuda_l1.evaluate.builder import default_builder

            build = default_builder(self.config)
        self.build = build
        self.supply: ChildSupply | None = None

    def evaluate(self, source: str) -> Verdict:
        if self.supply is None:
            self.supply = ChildSupply(self.config)
        return _evaluate_prepared(self.reference, source, self.config, self.build, self.supply)

    def evaluate_many(self, sources: Iterable[str]) -> list[Verdict]:
        return [self.evaluate(s) for s in sources]

    def close(self) -> None:
        """Stop the spare child, if any (also done when the evaluator is garbage-collected)."""
        if self.supply is not None:
            self.supply.close()
            self.supply = None

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


def evaluate_many(task: Task, sources: Iterable[str], config: EvalConfig | None = None) -> list[Verdict]:
    evaluator = Evaluator(task, config)
    try:
        return evaluator.evaluate_many(sources)
    finally:
        evaluator.close()
