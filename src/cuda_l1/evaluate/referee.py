"""One candidate through one evaluation: load it, then rounds of windows until the speedup is known.

Each round: fresh inputs from secret seeds into both sides' buffers; one window per side in random
order (thaw, run a batch of calls, stop it, wait until the device is idle; the parent's clock
measures all of it); then, with both sides stopped, the parent reads sampled calls' outputs at positions
drawn now and compares them (now and then one call in full against float64 or the reference). Checked
calls are timed calls: a side cannot tell which of its calls will be looked at.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import statistics
import time

from cuda_l1.evaluate import gating, process_counters, timing, verify, windows
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.device import Telemetry
from cuda_l1.evaluate.protocol import Mapped
from cuda_l1.evaluate.remote import RemoteMemory
from cuda_l1.evaluate.round_checks import RoundChecks
from cuda_l1.evaluate.sandbox import ChildFailure, SideProcess
from cuda_l1.evaluate.sides import ReferenceFailure, Side, load_side, mapped_inputs, side_estimate
from cuda_l1.evaluate.slots import RoundInputs, SlotBuffer
from cuda_l1.evaluate.verdict import COMPILE_ERROR, CORRECTNESS_ONLY, INCORRECT, REJECTED, RUNTIME_ERROR, TIMEOUT, Check

_SEVERITY = {REJECTED: 0, INCORRECT: 1}  # which status wins when several checks fail at once


class Referee(RoundChecks):
    """One evaluation's state and its phases: load, measure (the rounds; their checks in round_checks.py), finish."""

    def __init__(self, env, cand: SideProcess, source: str, config: EvalConfig, deadline: float,
                 thresholds: tuple[float, ...] = ()):
        self.env = env  # task_env.TaskEnv: the reference's side, inputs, probe
        # speedups the caller decides at: timing may stop once the interval is clear of all of them
        self.thresholds = tuple(thresholds) if config.timing.decide_early else ()
        self.spread = timing.process_spread(config, env.launch_share)  # between processes: widens the interval
        self.stopped = ""  # why timing stopped (timing.stop_reason)
        self.at_overhead = {"reference": 0, "candidate": 0}  # recorded windows no longer than the overhead
        self.window_faults: dict[str, int] = {}  # minor faults inside each side's windows (process_counters)
        # the recorded rounds' windows (reference, candidate) as measured; null windows measured again
        self.windows, self.overhead_checks = [], 0
        self.replanned: list[dict] = []  # calls a window, before and after each re-plan (measure)
        self.unresolved: str | None = None  # why the speedup is not measured (timing.resolution_note)
        self.config, self.source, self.deadline, self.cand_proc = config, source, deadline, cand
        self.checks: dict[str, Check] = {}
        self.reasons: list[str] = []
        self.status: str | None = None
        self.timing: dict = {}
        self.builds: list[dict] = []  # load_inline builds served in its load or first window
        self.comparisons: dict[int, list] = {}  # output position -> its full comparisons so far
        self.phases: dict[str, float] = {}  # seconds spent per part of measure()
        self.verify_spent: dict[str, float] = {}  # CUDA: verification's time by step (timing.phases_s)
        self.candidate_first: list[bool] = []  # per timed round: whether the candidate's window came first
        self.rng = random.Random(secrets.randbits(64))
        self.estimate: timing.Estimate | None = None
        self.cand: Side | None = None
        self.previous_calls: list = []  # the candidate's previous window (its outputs are still alive)
        self.drawn: tuple | None = None  # (round, checked calls) drawn right after the candidate's window (CUDA)
        self.settle_reads = 0  # candidate windows whose outputs were read right after them (settle_window)
        self.oracle_rounds, self.oracle_limited = 0, False  # rounds with a float64 comparison; whether any was held back
        self.rounds_verified = 0

    # -- bookkeeping ------------------------------------------------------------------------------------
    def _check(self, name: str, passed: bool | None, detail: str = "", blocking: bool = True) -> None:
        previous = self.checks.get(name)
        if previous is not None and previous.passed is False:
            return  # the first failure of a check is the informative one
        self.checks[name] = Check(name, passed, detail, blocking)

    def _fail(self, name: str, status: str, reason: str) -> None:
        if status == verify.NOTE:  # reported, not deciding (another order of a dense output layout)
            self._check(name, False, reason, blocking=False)
            return
        self._check(name, False, reason)
        self.reasons.append(reason)
        if self.status is None or _SEVERITY.get(status, -1) < _SEVERITY.get(self.status, -1):
            self.status = status

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ChildFailure(TIMEOUT, f"the evaluation took longer than its limit of {self.config.timeout_s:.0f} s")
        return left

    # -- phases ----------------------------------------------------------------------------------------
    def load(self, ahead: tuple | None = None) -> bool:
        """Load the candidate, or take what a helper thread loaded ahead (`ahead`: (Loaded, builds))."""
        env, cfg = self.env, self.config
        if ahead is None:
            self.cand_proc.allow_memory(env.note_reference_memory())
            loaded, self.builds = load_side(self.cand_proc, env.candidate_setup(self.source), min(cfg.load_timeout_s, self.remaining()),
                                            env.build, gate=env.supply.gate)
        else:  # thawing also checks that nothing of it ran while it was stopped
            (loaded, self.builds), _ = ahead, self.cand_proc.thaw()
        if loaded.signals:
            self._check("global_state", False, "importing the candidate re-bound: " + ", ".join(loaded.signals), blocking=False)
        if not loaded.ok:
            if loaded.kind == "compile_error":
                self._fail("compiles", COMPILE_ERROR, "the candidate does not load: " + loaded.message[-4000:])
                self.status = COMPILE_ERROR
            else:
                self._check("compiles", True, "module imported")
                self._fail("constructs", RUNTIME_ERROR, loaded.message[-4000:])
                self.status = RUNTIME_ERROR
            return False
        self._check("compiles", True, "module imported, ModelNew found")
        self._check("constructs", True, "ModelNew(*get_init_inputs()) built")
        buffer = SlotBuffer(env.source, env.n_slots, self.cand_proc.inputs_fd)
        self.cand = Side("candidate", self.cand_proc, buffer,
                         RemoteMemory(cfg.device, self.cand_proc.harness_pid, env.max_output_bytes))
        mapped = self.cand_proc.request(buffer.message(), min(cfg.call_timeout_s, self.remaining()), Mapped)
        if not mapped.ok:  # said by a process the candidate's code has run in: its failure, never the evaluator's
            raise ChildFailure(RUNTIME_ERROR, "the side could not map its inputs once the candidate was loaded: "
                               + mapped.message[-2000:])
        self.cand.input_ranges, self.cand.ring = mapped_inputs(self.cand), gating.ring_page(self.cand_proc, mapped)
        self.cand_proc.freeze()  # from now on the candidate runs only inside its own windows
        return True

    def _window(self, side: Side, slots: list[int], timeout: float, signals: bool = False,
                inputs: RoundInputs | None = None, written: int | None = None) -> None:
        """One window of `side` on the parent's clock (windows.py); `signals`: the first window.
        The side's page faults are read around it (process_counters: a diagnostic, outside its time)."""
        before = process_counters.minor_faults(side.proc.harness_pid()) if slots else None  # not null windows
        windows.run(self.env, side, slots, timeout, inputs, len(slots) if written is None else written,
                    first=signals, remaining=self.remaining, builds=self.builds)
        process_counters.add(self.window_faults, side.name, before, side.proc.harness_pid())

    def _reference_window(self, slots: list[int], timeout: float, signals: bool = False,
                          inputs: RoundInputs | None = None, written: int | None = None) -> None:
        try:
            self._window(self.env.ref, slots, timeout, signals, inputs, written)
        except ChildFailure as failure:
            raise ReferenceFailure(f"the reference's side failed during the candidate's evaluation: {failure}") from None
        if not self.env.ref.ran.ok:
            raise ReferenceFailure("the reference's forward raised:\n" + self.env.ref.ran.message[-3000:])

    def null_windows(self, calls: int, inputs: RoundInputs | None = None, count: int = 5) -> float:
        """The fixed cost of a window with no calls, on the reference: `calls` calls' inputs written (CPU: as
        many doorbell rings; `inputs`: the next round's, made ahead, else new ones), flushing, request, reply,
        stopping, idle probe. No other round's inputs may be alive (two at once: 12 GiB, an H100 out of memory)."""
        with self.phase("null_windows"):
            inputs, windows = inputs if inputs is not None and len(inputs) == calls else self.env.fresh_inputs(calls), []
            for _ in range(count):
                self._reference_window([], self.config.call_timeout_s, inputs=inputs, written=calls)
                windows.append(self.env.ref.window)
            return timing.overhead(windows)

    # -- the rounds -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, name: str):
        """Adds the time spent in the block to `phases[name]` (reported in timing.phases_s)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - start

    def measure(self) -> None:
        cfg, tc, env = self.config, self.config.timing, self.env
        env.calibrate_quiet()
        self.telemetry = Telemetry(cfg.device)
        self.telemetry_before = self.telemetry.read()
        self.counted = {side.name: (side.proc.harness_pid(), process_counters.read(side.proc.harness_pid()))
                        for side in (self.env.ref, self.cand)}
        measure_start = time.perf_counter()
        overhead_s = self.null_windows(1)
        plan = {"reference": 1, "candidate": 1}
        ref_ms, cand_ms, rounds, warm = [], [], 0, False
        started, timed_since, order = time.monotonic(), None, None
        ahead: RoundInputs | None = None  # the next round's inputs, made during the pause after verification
        while True:
            with self.phase("inputs"):
                count, pristine, ahead = max(plan.values()), ahead, None
                if pristine is None or len(pristine) != count:  # made ahead for another count: gone first
                    pristine = None
                    pristine = self.env.fresh_inputs(count)
                # Where both sides' slots start (slots.SHIFT_SPAN), drawn for a pair of rounds: the second
                # sees the first's pointers again, so a cache keyed by an input's address hits on new values.
                shift = self.cand.buffer.draw_shift() if rounds % 2 == 0 else self.cand.buffer.shift
                for side in (env.ref, self.cand):
                    side.buffer.set_shift(shift)
            pair = len(cand_ms) if warm else rounds  # recorded rounds start a pair of their own
            order = timing.window_order([env.ref, self.cand], order if pair % 2 else None, self.rng)
            first = rounds == 0
            signals = first  # informational, and it costs a snapshot inside the window: untimed round only
            for side in order:
                timeout = cfg.first_call_timeout_s if first else cfg.call_timeout_s + 50 * side_estimate(side)
                slots = list(range(plan[side.name]))
                if side is env.ref:
                    with self.phase("windows"):
                        self._reference_window(slots, timeout, inputs=pristine)
                    if not warm:  # the reference's peak sets what the candidate may hold (side_memory.py)
                        self.cand_proc.allow_memory(env.note_reference_memory())
                    continue
                with self.phase("windows"):
                    self._window(side, slots, timeout, signals, inputs=pristine)
                if not side.ran.ok:
                    self._fail("forward_runs", RUNTIME_ERROR, "forward raised:\n" + side.ran.message[-4000:])
                    self.status = RUNTIME_ERROR
                    return
                if side.ran.signals:
                    self._check("global_state", False, "the candidate re-bound: " + ", ".join(side.ran.signals),
                                blocking=False)
                if len(side.ran.calls) != len(slots):
                    self._fail("protocol", REJECTED, "the candidate reported a different number of calls than it was asked for")
                    return
                # drawn after the window: a round the candidate defers work in is read at settle_rate
                if self.settles() and self.rng.random() < tc.settle_rate:  # before the reference's window, if next
                    self.settle_reads += 1
                    self.settle_window(rounds)
                    if self.status is not None:
                        return
                    with self.phase("settle_read_after"):  # apart from "settle", the pause after verification
                        env.quiet.flush()  # the positions read leave the L2, where parked work could time them
                        if side is order[0]:  # the read ran in the reference's process, which a request
                            timing.settle(tc.settle_s)  # just before its window speeds up (settle_s)
            self.cand.proc.watch()
            with self.phase("verification"):
                self.verify_round(rounds)
            # The pause is for the reference's process, which stays stopped through it: the parent checks both
            # sides' inputs and makes the next round's (the plan's count, unless the warm-up changes it) meanwhile.
            resume_at = time.perf_counter() + tc.settle_s
            if not self._inputs_unchanged(slots, pristine) or self.status is not None:  # a change is named either way
                return
            pristine = None  # checked and verified: its memory goes to the next inputs, not beside them
            if cfg.device.startswith("cuda") and tc.settle_s > 0:
                with self.phase("inputs"):
                    ahead = self.env.fresh_inputs(max(plan.values()))
                with self.phase("settle"):
                    timing.settle(resume_at - time.perf_counter())
            rounds += 1
            if rounds == 1:  # the first calls' JIT compilers ran unpinned; every later window runs pinned
                env.pin_for_timing(env.ref.proc)
                env.pin_for_timing(self.cand_proc)
            if not tc.enabled:  # correctness only: the oracle rounds, no timing
                if rounds >= cfg.correctness_trials:
                    self._finish([], [], plan, overhead_s)
                    return
                continue
            if warm:
                self.windows.append((env.ref.window, self.cand.window))
                self.candidate_first.append(order[0] is self.cand)
                if timing.recheck_overhead(self.windows[-1], overhead_s, self.overhead_checks):
                    self.overhead_checks += 1
                    # The next round's inputs, made ahead, serve the null windows too (unchanged by them).
                    overhead_s = min(overhead_s, self.null_windows(plan["candidate"], ahead))
                ref_ms, cand_ms, self.at_overhead = timing.per_call_all(self.windows, overhead_s)
            else:
                # One count for both sides, sized on the reference (not the candidate's choice): what the
                # overhead's estimate gets wrong weighs the same on both, toward 1. A candidate far
                # slower shortens them (windows within 20 target lengths).
                per_call = {side.name: max(side.window.wall_s - overhead_s, 1e-7) / side.window.calls
                            for side in (env.ref, self.cand)}
                reference_n = timing.calls_for(per_call["reference"], tc.window_s, env.n_slots)
                n = min(reference_n, timing.calls_for(per_call["candidate"], 20 * tc.window_s, env.n_slots))
                plan = {"reference": n, "candidate": n}
                if rounds >= tc.warmup_rounds and time.monotonic() - started >= tc.warmup_s:
                    warm, timed_since = True, time.monotonic()
                    # The overhead again, now with as many slots written as every recorded window writes.
                    ahead = ahead if ahead is not None and len(ahead) == plan["candidate"] else None
                    overhead_s = self.null_windows(plan["candidate"], ahead)
                continue
            n, last = len(cand_ms), tc.min_rounds
            if n % last == 0 and len(self.replanned) < timing.MAX_REPLANS and plan["candidate"] < (
                    reference_n := max(reference_n, timing.calls_for(statistics.median(ref_ms[-last:]) / 1e3,
                                                                     tc.window_s, env.n_slots))):
                # The candidate's warm-up shortened everyone's windows. Slow there alone (one call a window puts
                # both sides in the fixed overhead, toward 1.00), it is timed again with the count its and the
                # reference's last min_rounds calls allow (the reference's last warm-up window alone once allowed
                # 2: ~0.1x scored 1.00, quick, H100); every min_rounds rounds (slow in the first 16 calls, 0.02x
                # work kept one call a window after a single look and scored 1.00).
                recorded_s = statistics.median(cand_ms[-last:]) / 1e3
                wider = min(reference_n, timing.calls_for(recorded_s, 20 * tc.window_s, env.n_slots))
                if wider >= 2 * plan["candidate"]:
                    self.replanned.append({"from": plan["candidate"], "to": wider, "after_rounds": n})
                    plan = {"reference": wider, "candidate": wider}
                    ref_ms, cand_ms, self.candidate_first, self.windows = [], [], [], []
                    self.at_overhead = {"reference": 0, "candidate": 0}
                    ahead, overhead_s, timed_since = None, self.null_windows(wider), time.monotonic()
                    continue
            if n >= tc.min_rounds and (n % 4 == 0 or n >= tc.max_rounds):
                self.estimate = timing.estimate(ref_ms, cand_ms, self.rng.randrange(1 << 30), self.candidate_first, self.spread)
            self.stopped = timing.stop_reason(
                n, self.estimate if n >= tc.min_rounds else None, time.monotonic() - timed_since,
                min_rounds=tc.min_rounds, max_rounds=tc.max_rounds, max_time_s=tc.max_time_s,
                target_width=tc.target_width, thresholds=self.thresholds, margin=tc.decide_margin) or ""
            if self.stopped:
                break
        self.estimate = timing.estimate(ref_ms, cand_ms, self.rng.randrange(1 << 30), self.candidate_first, self.spread)
        self.phases["measure_total"] = time.perf_counter() - measure_start
        self._finish(ref_ms, cand_ms, plan, overhead_s)

    def _finish(self, ref_ms, cand_ms, plan, overhead_s) -> None:
        tc = self.config.timing
        for name in ("forward_runs", "output_structure", "output_type", "dtype", "shape", "device", "strides",
                     "no_input_aliasing", "output_ownership", "inputs_unchanged", "outputs_readable",
                     *(("doorbell", "outputs_stable") if self.cand.rungs is not None else ())):
            self._check(name, True)
        compared = [c for cs in self.comparisons.values() for c in cs]
        worst = max(compared, key=lambda c: c.candidate_error / c.allowed_error if c.allowed_error else 0,
                    default=None)
        note = (f" (float64 in {self.oracle_rounds} of {self.rounds_verified} rounds: past its share of the windows' "
                f"time, {self.phases['oracle_rounds']:.1f} s, drawn less often)" if self.oracle_limited else "")
        against = "float64"
        if self.env.oracle_unavailable:  # said where a reader of the checks looks, not only in a detail
            against = "the reference at KernelBench's tolerance"
            self._check("float64_oracle", False, "the reference has no float64 run, so outputs were held to "
                        f"KernelBench's tolerance only: {self.env.oracle_unavailable[:300]}", blocking=False)
        self._check("correctness", True, f"{len(compared)} outputs in full against {against}, the rest at "
                    f"{tc.spot_checks} positions each; worst: {worst.detail if worst else 'n/a'}{note}")
        self._check("frozen_between_windows", True, "every process of both sides was stopped outside its windows")
        if self.settles() and self.settle_reads:  # (claimed only where it was done)
            self._check("outputs_settled", True, f"in {self.settle_reads} of {self.rounds_verified} rounds, positions "
                        "of the checked calls' outputs read right after the candidate's window held the same bytes "
                        "at the end of the round's verification")
        hidden = self.cand.window.idle_wait_s if self.cand.window else 0.0
        if not ref_ms:
            self.timing = {"protocol": CORRECTNESS_ONLY}
            return
        self.timing = timing.report(timing.Recorded(ref_ms, cand_ms, list(self.candidate_first)), plan, overhead_s,
                                    hidden, self.env.quiet.idle_s, self.phases)
        self.timing["stopped"] = self.stopped
        self.timing["windows_at_overhead"] = dict(self.at_overhead)
        self.timing["overhead_checks"] = self.overhead_checks  # timing.recheck_overhead
        self.timing.update({"replanned": self.replanned} if self.replanned else {})
        self.unresolved = timing.resolution_note(self.at_overhead, len(cand_ms), overhead_s, statistics.median(ref_ms) / 1e3,
                                                 self.env.ref.harness_per_call)  # the reference's: trusted
        self._check("timing_resolved", self.unresolved is None, self.unresolved or "", blocking=False)
        if self.thresholds:
            self.timing["thresholds"] = list(self.thresholds)
        after = self.telemetry.read()
        self.timing["telemetry"] = {"before": self.telemetry_before, "after": after}
        self.timing["sides"] = process_counters.report(self.counted, self.window_faults)
        self.timing["throttled"] = any(t.get("throttled") for t in (self.telemetry_before, after) if t)
