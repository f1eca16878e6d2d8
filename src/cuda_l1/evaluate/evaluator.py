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
import secrets
import time
import traceback
from typing import Callable

import torch

from cuda_l1.errors import TaskError, UserError
from cuda_l1.evaluate import side_memory, static_scan
from cuda_l1.evaluate.build.requests import default_builder
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.device import device_name, gpu_healthy, normalize_device, versions
from cuda_l1.evaluate.protocol import Mapped, Release, Setup
from cuda_l1.evaluate.quiet import Quiet
from cuda_l1.evaluate.referee import Referee
from cuda_l1.evaluate.sides import ReferenceFailure, Side, load_side, mapped_inputs
from cuda_l1.evaluate.remote import RemoteMemory
from cuda_l1.evaluate.pinning import pin_side
from cuda_l1.evaluate.sandbox import ChildFailure, SideProcess
from cuda_l1.evaluate.side_supply import SideKind, SideSupply
from cuda_l1.evaluate.slots import InputSource, SlotBuffer
from cuda_l1.evaluate.verdict import OK, RUNTIME_ERROR, TIMEOUT, Check, Verdict, clean_text
from cuda_l1.tasks import Task, code_id
from cuda_l1.tasks.runtime import check_forward_args, check_init_args, load_task_module, module_footprint

MAX_SLOTS = 256  # input slots per side: the most calls one window can make


def _idlest(cores: list[int], sample_s: float = 0.05) -> int:
    """The core that was idle longest over a short sample (/proc/stat), so evaluators started side by
    side spread over the cores instead of all timing on the first one."""
    def idle() -> dict[int, int]:
        out = {}
        try:
            with open("/proc/stat") as fh:
                for line in fh:
                    name, *fields = line.split()
                    if name.startswith("cpu") and name[3:].isdigit() and len(fields) > 4:
                        out[int(name[3:])] = int(fields[3]) + int(fields[4])  # idle + iowait
        except OSError:
            pass
        return out

    before = idle()
    time.sleep(sample_s)
    after = idle()
    return max(cores, key=lambda c: (after.get(c, 0) - before.get(c, 0), -c))


def timing_core(config: EvalConfig) -> int | None:
    """The core both sides are timed on: CPU device with one thread, where the platform can pin; on a
    GPU only when `cpu_core` is given (launch-bound tasks then run both sides' host code on one core)."""
    if (config.threads or 1) != 1 or not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if config.cpu_core is not None:
        return config.cpu_core if config.cpu_core in allowed else None
    if config.device != "cpu":
        return None
    return _idlest(allowed) if len(allowed) > 1 else (allowed[0] if allowed else None)


def gpu_timed_core(config: EvalConfig) -> int | None:
    """The core a GPU evaluation pins both sides to after their first window (None: not pinned, or
    pinned from the start by `cpu_core`)."""
    if not config.device.startswith("cuda") or not config.pin_gpu_sides or config.cpu_core is not None:
        return None
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if config.timed_core is not None:
        return config.timed_core if config.timed_core in allowed else None
    return _idlest(allowed) if len(allowed) > 1 else None


def _slot_budget(config: EvalConfig, input_bytes: int, output_bytes: int | None = None) -> int:
    """Slots per side: the inputs of a window live three times (generated, and in each side's buffer)
    and each side keeps the outputs of two windows (this one's and the last one's) until they are
    read. `output_bytes` (one call's, from a meta-device run) is taken to be as large as the inputs
    when unknown: a small-input task with a large output (KernelBench's matmul with K=32: 4 MiB in,
    1 GiB out) would otherwise get 256 slots and exhaust the GPU."""
    if config.input_memory_bytes:
        budget = config.input_memory_bytes
    elif config.device.startswith("cuda"):
        budget = torch.cuda.get_device_properties(torch.device(config.device)).total_memory // 5
    else:
        budget = 1 << 30
    out = input_bytes if output_bytes is None else output_bytes
    return max(1, min(MAX_SLOTS, budget // max(3 * input_bytes + 4 * out, 1)))


def _output_bytes(module) -> int | None:
    """Bytes of one call's outputs, from the reference (its loaded module) run on torch's meta device
    (no memory, no kernels); None when it cannot run there (a data-dependent shape, an explicit device)."""
    try:
        return module_footprint(module)["output_bytes"]
    except Exception:  # noqa: BLE001 - only a budget hint: the input-sized guess stands in
        return None


class TaskEnv:
    """What every evaluation of one task shares: the reference's side, the input source, the probe."""

    def __init__(self, task: Task, config: EvalConfig, build: Callable | None, supply: SideSupply):
        self.task, self.config, self.build, self.supply = task, config, build, supply
        self.device = config.device
        self.core = timing_core(config)
        self.timed_core = gpu_timed_core(config)  # why GPU sides are pinned at all: pinning.py
        self.threads = config.threads or 1
        self.init_seed = secrets.randbits(62)
        origin = task.origin or task.name
        module = load_task_module(task, module_name=f"cuda_l1_ref_{task.id}")
        from cuda_l1.evaluate import inputs as inputs_mod

        check_init_args(inputs_mod.make_init_inputs(module, self.init_seed), origin)
        check_forward_args(inputs_mod.make_inputs(module, 0, self.device), origin)
        self.source = InputSource(module, self.device, origin)
        self.n_slots = _slot_budget(config, self.source.input_bytes(), _output_bytes(module))
        self.max_output_bytes = (torch.cuda.get_device_properties(torch.device(self.device)).total_memory
                                 if self.device.startswith("cuda") else config.sandbox.memory_bytes)
        self.read_paths: list[str] = []  # built extensions are handed to a side in its scratch directory
        self.quiet = Quiet(self.device, flush=config.timing.flush_cache, core=self.core)
        self.oracle_unavailable = ""
        self.reference_peak = 0  # host memory the reference's side was seen holding (side_memory.py)
        self.ref: Side | None = None
        self.start_reference()

    def start_side(self, memory_limit: int | None = None) -> SideProcess:
        """A fresh side (from the supply: maybe started ahead); a candidate's may hold what the
        reference's measured peak allows."""
        limit = memory_limit or side_memory.candidate_limit(self.config.sandbox, self.reference_peak)
        kind = SideKind(repr(self.config.sandbox), self.device, tuple(self.read_paths), self.core)
        return self.supply.take(kind, lambda lim: SideProcess.start(self.config.sandbox, self.device, self.read_paths,
                                                                    self.core, memory_limit=lim), limit)

    def pin_for_timing(self, proc: SideProcess) -> None:
        """Pin a stopped side to the GPU evaluation's timed core, once (the reference's side lives on
        across candidates and keeps its pin)."""
        if self.timed_core is not None and proc.pinned_core != self.timed_core:
            pin_side(proc, self.timed_core)

    def note_reference_memory(self) -> int:
        """Read what the reference's side holds now; returns the candidate limit it implies."""
        if self.ref is not None:  # now, and the most its watchdog saw during the windows
            held = self.ref.proc.memory_bytes()
            self.reference_peak = max(self.reference_peak, held, self.ref.proc.peak_memory)
        return side_memory.candidate_limit(self.config.sandbox, self.reference_peak)

    def start_reference(self) -> None:
        proc = self.start_side(side_memory.reference_limit(self.config.sandbox))
        origin = self.task.origin or self.task.name
        try:
            setup = Setup("reference", self.task.source, self.task.source, "Model", self.init_seed, self.threads)
            loaded, _ = load_side(proc, setup, self.config.load_timeout_s, self.build)
            if not loaded.ok:
                raise TaskError("the reference does not load in the sandbox:\n" + loaded.message[-3000:], path=origin)
            buffer = SlotBuffer(self.source, self.n_slots, proc.inputs_fd)
            mapped = proc.request(buffer.message(), self.config.call_timeout_s, Mapped)
            if not mapped.ok:
                raise RuntimeError("the reference's side could not map its inputs: " + mapped.message)
            self.ref = Side("reference", proc, buffer, RemoteMemory(self.device, proc.harness_pid, self.max_output_bytes))
            self.ref.input_ranges = mapped_inputs(self.ref)
            self.note_reference_memory()
            proc.freeze()
        except ChildFailure as failure:
            log = proc.close(graceful=False)
            raise TaskError(f"the reference cannot run in the sandbox: {failure}\n{log[-2000:]}", path=origin) from None
        except BaseException:
            proc.close(graceful=False)
            raise

    def restart_reference(self) -> None:
        self.close_reference()
        self.start_reference()

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)

    def close_reference(self) -> None:
        if self.ref is not None:
            self.ref.memory.close()
            self.ref.proc.close(graceful=True)
            self.ref.buffer.close()
            self.ref = None

    def close(self) -> None:
        self.close_reference()


def prewarm_of(config: EvalConfig) -> bool:
    """Whether sides are started ahead: on a GPU unless told (on a CPU a warming side would compete
    with the timed calls for the cores)."""
    return config.prewarm if config.prewarm is not None else config.device.startswith("cuda")


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
        self.env = TaskEnv(task, config, self.build, self.supply)

    def evaluate(self, source: str, remeasure: bool = True, thresholds: tuple[float, ...] = ()) -> Verdict:
        """One verdict. `thresholds`: speedups the caller decides at (bucket edges, the best so far);
        timing may stop as soon as the interval is clear of all of them."""
        verdict = self._evaluate_once(source, thresholds)
        if remeasure and self.config.remeasure and needs_remeasure(verdict, self.config):
            verdict = merge_remeasure(verdict, self._evaluate_once(source, thresholds),
                                      f"same device, {self.config.device}")
        return verdict

    def _evaluate_once(self, source: str, thresholds: tuple[float, ...] = ()) -> Verdict:
        started = time.monotonic()
        config, env = self.config, self.env
        verdict = Verdict(status=RUNTIME_ERROR, device=device_name(config.device), versions=versions(config.device),
                          task_id=self.task.id, task_name=self.task.key, candidate_id=code_id(source))
        findings = static_scan.scan(source)
        if env.ref is None:
            env.start_reference()
        side_started = time.perf_counter()
        cand = env.start_side()
        referee = Referee(env, cand, source, config, deadline=started + config.timeout_s, thresholds=thresholds)
        referee.phases["start_side"] = time.perf_counter() - side_started  # a spare's hand-over, or a start
        try:
            with referee.phase("load"):
                loaded = referee.load()
            if loaded:
                referee.measure()
        except ChildFailure as failure:
            referee._fail("runs_to_completion", failure.kind, str(failure))
            referee.status = failure.kind
        except ReferenceFailure as failure:
            referee._fail("reference_ran", RUNTIME_ERROR, f"{failure} (the candidate was running beside it)")
            referee.status = RUNTIME_ERROR
            env.restart_reference()
        except (TaskError, UserError):
            raise
        except Exception as exc:  # noqa: BLE001 - the evaluator never ends an evaluation with a traceback
            referee._fail("evaluator", RUNTIME_ERROR, f"the evaluation failed: {type(exc).__name__}: {exc}")
            referee.status = RUNTIME_ERROR
            verdict.timing["evaluator_error"] = traceback.format_exc()[-3000:]
        finally:
            with referee.phase("teardown"):
                if referee.cand is not None:
                    referee.cand.memory.close()
                log = cand.close(graceful=referee.status is None)
                if referee.cand is not None:
                    referee.cand.buffer.close()
                self._settle_reference()
        checks = list(referee.checks.values())
        checks.append(Check("static_scan", not findings, static_scan.summary(findings), blocking=False))
        # Reasons, details and the log may carry text the candidate wrote (exception messages, prints).
        verdict.checks = [dataclasses.replace(c, detail=clean_text(c.detail)) for c in checks]
        verdict.reasons, verdict.log = [clean_text(r) for r in referee.reasons], clean_text(log)
        verdict.sandbox = dict(cand.notes)
        verdict.sandbox["memory"] = {"limit_bytes": cand.memory_limit, "peak_bytes": cand.peak_memory,
                                     "reference_peak_bytes": env.reference_peak}
        if referee.builds:
            verdict.timing["builds"] = referee.builds
        if referee.status is not None:
            verdict.status = referee.status
            if config.device.startswith("cuda") and referee.status in (RUNTIME_ERROR, TIMEOUT):
                with referee.phase("gpu_health"):
                    healthy, note = gpu_healthy(config.device)
                verdict.checks.append(Check("gpu_health_after", healthy, note, blocking=False))
        elif referee.estimate is None:  # timing disabled: correct, not timed
            verdict.status = OK
            verdict.timing = {**referee.timing, **verdict.timing}
        else:
            est = referee.estimate
            verdict.status = OK
            verdict.raw_speedup, verdict.ci = est.point, [est.lo, est.hi]
            verdict.reference_ms, verdict.candidate_ms = est.reference_ms, est.candidate_ms
            verdict.speedup = est.score
            verdict.timing = {**referee.timing, **verdict.timing}
        # Where the time went, for every verdict (a timed one's report holds the same, taken earlier).
        verdict.timing["phases_s"] = {k: round(v, 3) for k, v in referee.phases.items()}
        verdict.timing["phases_s"].update({f"verify.{k}": round(v, 3) for k, v in referee.verify_spent.items()})
        verdict.elapsed_s = time.monotonic() - started
        return verdict

    def _settle_reference(self) -> None:
        """The reference's side ends every evaluation stopped, holding nothing of the candidate (or is
        restarted if it is not healthy)."""
        ref = self.env.ref
        if ref is None:
            return
        if ref.proc.exit_info().reason != "running":
            self.env.close_reference()
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
