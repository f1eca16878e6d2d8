"""Reading a checked call's outputs and judging them, with both sides stopped.

On a CPU the parent reads both sides' outputs from their memory and compares them itself. On a GPU
the reference's side opens the candidate's outputs through their IPC handles and compares them with
its own, which never leave it (protocol.Verify). Either way the positions are drawn by the referee,
after the window, where no side can see them; the float64 oracle is the reference's side recomputing
the same call in double precision.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable

from cuda_l1.evaluate import output_memory, pinning, settled_outputs, verify
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.protocol import MAX_ORACLE_THREADS, CallToVerify, LeafVerdict, Oracle, Oracled, Verified, Verify
from cuda_l1.evaluate.remote import Unreadable
from cuda_l1.evaluate.sandbox import ChildFailure
from cuda_l1.evaluate.sides import ReferenceFailure, Side
from cuda_l1.evaluate.verdict import REJECTED, RUNTIME_ERROR, TIMEOUT

# After the first round the float64 oracle is drawn at `oracle_rate` while its rounds have cost no more
# than a share of what the recorded windows took (at least ORACLE_FLOOR_S, at most ORACLE_SLOW_S), and
# less often beyond it, but never never: a round known to be exempt is a round to cheat in (a switch
# to zero once let a candidate tell, from the gaps between its windows, which rounds no float64
# comparison could look at). A round without it compares against the reference's own output. On
# KernelBench's 6 GiB elementwise tasks an oracle round costs about 0.15 s against 23 ms for the round's
# two windows (H100): drawn at its rate until 5 s, the oracle took about 5 s of an 11 s verdict and left
# the timing fewer rounds within its cap. Where the windows take longer than the oracle (most tasks)
# nothing changes. (A 16 GiB KernelBench input in float64 fell back to the CPU: 40 s a round.)
ORACLE_SLOW_S = 5.0
ORACLE_FLOOR_S = 0.5  # what the oracle's rounds may take at its full rate, whatever the windows took
ORACLE_SHARE = 0.25  # of the recorded windows' time, beyond the floor


def oracle_rate(rate: float, oracle_s: float, windows_s: float) -> float:
    """The chance that a timed round after the first has a call compared against float64: `rate` while the
    oracle's rounds so far (`oracle_s`) are within their budget (ORACLE_SHARE of the recorded windows'
    `windows_s`, within [ORACLE_FLOOR_S, ORACLE_SLOW_S]); beyond it, `rate` times the square of budget
    over spent. Never zero, and what the oracle costs in all then grows only as the cube root of the
    rounds (each draw costs what the last ones did, at a chance falling as the square of their sum)."""
    budget = min(ORACLE_SLOW_S, max(ORACLE_FLOOR_S, ORACLE_SHARE * windows_s))
    return rate if oracle_s <= budget else rate * (budget / oracle_s) ** 2


def draw_checked(rng, calls: int, round_no: int, config: EvalConfig, rate: float | None = None) -> list[tuple[int, str]]:
    """The calls of a round that are looked at, and how ('spots', 'full' against the reference's output,
    'oracle' in full against float64), drawn after the window, where no side can see it. The oracle:
    every round of a correctness-only run; when timed, the first round and then rounds drawn at `rate`
    (oracle_rate's, by default TimingConfig.oracle_rate). (Only the first rounds, as before, let a
    candidate that counts its requests be exact there and 7% off in every later round.)"""
    tc = config.timing
    sample = rng.sample(range(calls), min(calls, tc.checked_calls))
    oracle_round = (round_no < config.correctness_trials if not tc.enabled else round_no == 0
                    or rng.random() < (tc.oracle_rate if rate is None else rate))
    oracle_at = rng.choice(sample) if oracle_round else None
    full_at = rng.choice(sample) if oracle_at is None and rng.random() < tc.full_check_rate else None
    return [(i, "oracle" if i == oracle_at else "full" if i == full_at else "spots") for i in sorted(sample)]


def here(env, cand: Side, cand_call, ref_call, slot: int, mode: str, bounds: list, rng, config: EvalConfig,
         time_left: Callable[[], float]) -> list[LeafVerdict]:
    """CPU: one verdict per output of the call, compared in this process."""
    ref_leaves = []
    for leaf in ref_call.leaves:
        try:
            ref_leaves.append(env.ref.memory.tensor(leaf) if leaf.kind == "tensor" else None)
        except Unreadable as exc:
            raise ReferenceFailure(f"the reference's outputs could not be read: {exc}") from None
    oracle = float64_outputs(env, slot, config, time_left) if mode == "oracle" else None
    results = []
    limit = output_memory.read_limit(output_memory.span_bytes(ref) for ref in ref_call.leaves if ref.kind == "tensor")
    compared = [pos for pos, (leaf, ref) in enumerate(zip(cand_call.leaves, ref_leaves))
                if ref is not None and leaf.kind == "tensor"]
    read = dict(zip(compared, cand.memory.call_tensors([cand_call.leaves[pos] for pos in compared], limit)))
    for pos, (leaf, ref) in enumerate(zip(cand_call.leaves, ref_leaves)):
        if pos not in read:
            results.append(LeafVerdict(True))
            continue
        got = read[pos]
        if isinstance(got, Unreadable):
            results.append(LeafVerdict(False, unreadable=str(got)))
            continue
        o = oracle[pos] if oracle else None
        results.append(verify.judge_leaf(got, ref, o, mode, bounds[pos], rng, config.timing.spot_checks,
                                         config.tolerance, time_left))
    return results


def on_reference(env, checked: list[tuple], bounds: list, rng, config: EvalConfig,
                 time_left: Callable[[], float], spent: dict | None = None,
                 input_handle: str = "") -> tuple[list[list[LeafVerdict]], str]:
    """CUDA: per checked call (index, candidate's call, mode), one verdict per output, compared by the
    reference's side in one request for all of them, and what changed in the outputs read right after
    the window ("" if nothing: settle_on_reference). `spent` gathers where the time went; `input_handle`
    names the candidate's input buffer, which the reference's side refuses outputs in by its memory."""
    ref = env.ref
    wire_bounds = [-1.0 if b is None else b for b in bounds]
    calls = [CallToVerify(index, index, mode, wire_bounds, rng.randrange(1 << 62), cand_call.leaves)
             for index, cand_call, mode in checked]
    request = Verify(calls, config.timing.spot_checks, dataclasses.asdict(config.tolerance), input_handle)
    reply = _verified(ref, request, config, time_left, spent, "comparing")
    if spent is not None:
        for key, seconds in reply.spent_s.items():
            spent["side_" + key] = spent.get("side_" + key, 0.0) + seconds
    if reply.oracle_note:
        env.oracle_unavailable = reply.oracle_note
    return reply.calls, reply.unsettled


def settle_on_reference(env, calls: list[tuple[int, object]], rng, config: EvalConfig,
                        time_left: Callable[[], float], spent: dict | None = None,
                        input_handle: str = "") -> list[list[LeafVerdict]]:
    """CUDA, right after the candidate's window: the reference's side reads a few positions of each
    listed (index, candidate's call) and keeps them for the round's verification (settled_outputs.py).
    One verdict per output: unreadable ones say why."""
    request = Verify([CallToVerify(index, index, "settle", [], rng.randrange(1 << 62), call.leaves)
                      for index, call in calls], settled_outputs.SPOTS, dataclasses.asdict(config.tolerance),
                     input_handle)
    return _verified(env.ref, request, config, time_left, spent, "reading outputs after their window").calls


def _verified(ref: Side, request: Verify, config: EvalConfig, time_left: Callable[[], float], spent: dict | None,
              doing: str) -> Verified:
    """The reference side's answer to a Verify request: one that failed, or that answers for other calls
    or outputs than were asked about, is the reference's failure."""
    reply = _ask_reference(ref, request, Verified, config, time_left, f"the reference's side failed while {doing}",
                           spent, calls=len(request.calls))
    if not reply.ok and reply.device_fault:
        # The side tells its own oracle's faults apart (reference_checks: those reply without the flag);
        # the rest of a Verify touches the candidate's memory and the side's own kept outputs. A mapping
        # that opens and faults when touched is a forged handle's (an edited legacy IPC handle can open
        # one: benchmarks/gpu_hypotheses/handle_sweep.py). The parent's health check of the device follows.
        raise ReferenceFailure(f"reading the candidate's outputs faulted on the device while {doing} "
                               f"({reply.message[:200]})", REJECTED, "outputs_readable", device_fault=True)
    if not reply.ok:
        raise ReferenceFailure(f"the reference's side failed while {doing}: " + reply.message)
    if len(reply.calls) != len(request.calls) or any(len(v) != len(c.leaves) for v, c in zip(reply.calls, request.calls)):
        raise ReferenceFailure("the reference's side answered for other calls than it was asked about")
    return reply


def float64_outputs(env, slot: int, config: EvalConfig, time_left: Callable[[], float]) -> list | None:
    """The float64 oracle's outputs for the call of `slot` (None, with the reason noted, when the task
    has none: e.g. an op without a float64 kernel)."""
    ref = env.ref
    msg = _ask_reference(ref, Oracle(slot), Oracled, config, time_left, "the float64 reference failed")
    if not msg.ok or msg.call is None:
        env.oracle_unavailable = msg.message
        return None
    try:
        return [ref.memory.tensor(leaf) if leaf.kind == "tensor" else None for leaf in msg.call.leaves]
    except Unreadable as exc:
        raise ReferenceFailure(f"the float64 reference's outputs could not be read: {exc}") from None


def _out_of_time(time_left: Callable[[], float]) -> bool:
    """Whether the evaluation's own time is spent (its time_left raises at the deadline, or says 0)."""
    try:
        return time_left() <= 0
    except ChildFailure:
        return True


def _ask_reference(ref: Side, request, expect: type, config: EvalConfig, time_left: Callable[[], float], failed: str,
                   spent: dict | None = None, calls: int = 1):
    """One request to the reference's side (about `calls` calls' work), resumed for it and stopped
    again after."""
    marks = [time.perf_counter()]
    # A float64 oracle that falls back to the CPU runs on the parent's cores, not the one of the pin
    # (pinning.spread_side); the side is pinned again, stopped, before anything else runs.
    cores = _cores(config) if _has_oracle(request) else set()
    spread = bool(cores) and pinning.spread_side(ref.proc, cores)
    if spread:  # and the oracle's CPU threads as many (by default one: an unpinned side is not narrowed)
        threads = min(len(cores), MAX_ORACLE_THREADS)
        request = (dataclasses.replace(request, threads=threads) if isinstance(request, Oracle)
                   else dataclasses.replace(request, oracle_threads=threads))
    ref.proc.thaw()
    marks.append(time.perf_counter())
    try:
        return ref.proc.request(request, min(config.call_timeout_s * 4 * max(calls, 1), time_left()), expect)
    except ChildFailure as failure:
        # At the evaluation's deadline (the request was given what was left of it) the candidate's
        # verdict is timeout, as for any phase that outlasts the limit; the side restarts either way.
        raise ReferenceFailure(f"{failed}: {failure}", TIMEOUT if _out_of_time(time_left) else RUNTIME_ERROR) from None
    finally:
        marks.append(time.perf_counter())
        if ref.proc.exit_info().reason == "running":
            ref.proc.freeze()
            if spread:  # (spread_side leaves pinned_core as it was)
                pinning.pin_side(ref.proc, ref.proc.pinned_core)
        marks.append(time.perf_counter())
        if spent is not None:
            for key, a, b in zip(("thaw", "request", "freeze"), marks, marks[1:]):
                spent[key] = spent.get(key, 0.0) + b - a


def _has_oracle(request) -> bool:
    """Whether a request to the reference's side runs the float64 oracle."""
    return isinstance(request, Oracle) or (isinstance(request, Verify) and any(c.mode == "oracle" for c in request.calls))


def _cores(config: EvalConfig) -> set[int]:
    """The cores a side spread for its oracle gets: this process's, less those other workers of the pool
    time their sides on (busy_cores)."""
    return os.sched_getaffinity(0) - set(config.busy_cores) if hasattr(os, "sched_getaffinity") else set()
