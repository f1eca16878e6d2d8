"""What every evaluation of one task shares (`TaskEnv`): the reference's side, kept for the task; the
input source, which makes fresh inputs from secret seeds in the parent; the idle probe; and where the
sides are timed (the core of a CPU evaluation, the core GPU sides are pinned to after their first
window). Also the input-slot budget, from the inputs' and one call's outputs' sizes.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import time
from typing import Callable

import torch

from cuda_l1.errors import BrokenTask, TaskError
from cuda_l1.evaluate import fork_server, gating, side_memory
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.pinning import pin_side
from cuda_l1.evaluate.protocol import Mapped, Setup
from cuda_l1.evaluate.quiet import Quiet
from cuda_l1.evaluate.remote import RemoteMemory
from cuda_l1.evaluate.sandbox import ChildFailure, SideProcess
from cuda_l1.evaluate.side_supply import SideKind, SideSupply
from cuda_l1.evaluate.sides import Side, load_side, mapped_inputs
from cuda_l1.evaluate.task_marks import GRACE_S, in_worker, running_task_code
from cuda_l1.evaluate.slots import InputSource, SlotBuffer
from cuda_l1.tasks import Task
from cuda_l1.tasks.deadline import task_deadline
from cuda_l1.tasks.runtime import load_task_module, run_reference_once
from cuda_l1.tasks.task_failures import TASK_FAILURES, describe_exception, escaped_task_failure, is_task_failure

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


def _slot_budget(config: EvalConfig, input_bytes: int, output_bytes: int) -> int:
    """Slots per side: the inputs of a window live three times (generated, and in each side's buffer)
    and each side keeps the outputs of two windows (this one's and the last one's) until they are
    read. `output_bytes`: one call's, from the reference's run (a small-input task with a large output,
    KernelBench's matmul with K=32: 4 MiB in, 1 GiB out, would get 256 slots on its inputs alone and
    exhaust the GPU).

    On a GPU: two fifths of the device, and no more than half of what is free now (a worker holds the
    references of other tasks, each with its slots). Every window has a fixed cost of its own (about
    0.2 ms on an H100: the first window of a round is slower than the second), so more calls a window
    make a round less noisy: with a fifth, KernelBench-sized memory-bound tasks got 2-3 slots and
    identical code needed 28-112 rounds (cf. 16-20 with 32 GiB on an 80 GiB H100, 6-7 slots)."""
    if config.input_memory_bytes:
        budget = config.input_memory_bytes
    elif config.device.startswith("cuda"):
        device = torch.device(config.device)
        free, total = torch.cuda.mem_get_info(device)
        budget = min(total * 2 // 5, free // 2)
    else:
        budget = 1 << 30
    return max(1, min(MAX_SLOTS, budget // max(3 * input_bytes + 4 * output_bytes, 1)))


def _heap_reserve(config: EvalConfig, output_bytes: int, n_slots: int) -> int:
    """CPU: the host heap each side touches before its first window (warmup.reserve_heap). glibc's heap
    grew by 17 output blocks before it settled with one call a window, by twice the live outputs with
    more (the outputs of two windows stay alive: _slot_budget)."""
    if config.device != "cpu":
        return 0
    return min(config.heap_reserve_bytes, max(20 * output_bytes, 4 * n_slots * output_bytes))


def _device_trouble(exc: BaseException) -> bool:
    """An error of the machine rather than of the task's code: out of the device's memory (or the host's:
    a candidate's side holds it too), or a CUDA error."""
    text = describe_exception(exc)
    return issubclass(type(exc), torch.cuda.OutOfMemoryError) or (
        issubclass(type(exc), RuntimeError) and any(words in text for words in ("CUDA", "out of memory",
                                                                                 "not enough memory")))


def _escaped(exc: BaseException, origin: str) -> str:
    """BrokenTask's words for what escaped the task's code whole (tasks.task_failures.escaped_task_failure), or
    re-raise it where it is not the task's."""
    if not escaped_task_failure(exc, in_worker()):
        raise exc
    return f"{origin}: the task's code raised {describe_exception(exc)}"


def _input_source(module, device: str, origin: str) -> InputSource:
    """The task's inputs' source, which calls get_inputs() again: its failure is the task's."""
    try:
        return InputSource(module, device, origin)
    except TaskError:
        raise
    except TASK_FAILURES as exc:
        if not is_task_failure(exc):
            raise
        message = f"get_inputs() raised on a later call: {describe_exception(exc)}"
        raise TaskError(message, path=origin) from None


class TaskEnv:
    """What every evaluation of one task shares: the reference's side, the input source, the probe."""

    def __init__(self, task: Task, config: EvalConfig, build: Callable | None, supply: SideSupply):
        self.task, self.config, self.build, self.supply = task, config, build, supply
        self.device = config.device
        self.core = timing_core(config)
        self.timed_core = gpu_timed_core(config)  # why GPU sides are pinned at all: pinning.py
        self.threads = config.threads or 1
        self.init_seed = secrets.randbits(62)
        # Seconds of this task's preparation by step, reported with the task's first verdict: the
        # time no candidate is charged with (timing.phases_s, as "task.*").
        self.setup_phases: dict[str, float] = {}
        lap = time.perf_counter()

        def mark(name: str) -> None:
            nonlocal lap
            now = time.perf_counter()
            self.setup_phases[name] = now - lap
            lap = now

        origin = task.origin or task.name
        with supply.gate:  # the parent's own work on the device: never beside a timed window
            # The reference is run once here, in this trusted process, before any candidate of the task
            # is judged: a broken one is the task's error (BrokenTask, bad input), never a verdict on a
            # candidate. The callers that judge many tasks (bench, audit) leave this check to the
            # workers. Its outputs' size budgets the input slots; a run on torch's meta device gave it
            # before, for the price of importing Dynamo (about 1 s) and none where a shape depends on
            # the data. (What fails later, in the sandbox, is the evaluation's failure: see start_reference.)
            broken = ""
            try:
                # A death in it is the task's; on a helper thread, so is running past its three deadlines.
                with running_task_code(task.id, limit_s=3 * config.task_timeout_s + GRACE_S):
                    module = load_task_module(task, module_name=f"cuda_l1_ref_{task.id}",
                                              timeout_s=config.task_timeout_s)
                    mark("module")
                    first = run_reference_once(module, origin, self.device, mode=config.module_mode,
                                               timeout_s=config.task_timeout_s, measure_launches=True)
                    mark("reference_once")
                    with task_deadline(config.task_timeout_s, "the task's inputs (get_inputs)", origin):
                        self.source = _input_source(module, self.device, origin)
            except TaskError as exc:
                broken = str(exc)
            except BaseException as exc:  # noqa: BLE001 - a worker that died of it blamed its candidate
                broken = _escaped(exc, origin)
            if self.device.startswith("cuda"):
                # Its model, inputs and outputs are gone, a failed run's too: their memory goes back
                # (a worker keeping a failed run's peak cached would crowd the sides it starts next).
                if broken:
                    gc.collect()
                    with contextlib.suppress(RuntimeError):  # after a fatal CUDA error it fails as the run did
                        torch.cuda.empty_cache()
                else:
                    torch.cuda.empty_cache()
            if broken:  # raised here, outside the handler: no traceback keeps the failed run's tensors
                raise BrokenTask(broken)
            self.n_slots = _slot_budget(config, self.source.input_bytes(), first.output_bytes)
            self.heap_reserve_bytes = _heap_reserve(config, first.output_bytes, self.n_slots)  # both sides alike
            # how far identical code strays between processes on this task (timing.process_spread)
            self.launch_share = first.launch_share
            self.ignores_inputs = first.ignores_inputs  # its outputs the same for other inputs: any constant is right
            self.max_output_bytes = (torch.cuda.get_device_properties(torch.device(self.device)).total_memory
                                     if self.device.startswith("cuda") else config.sandbox.memory_bytes)
            mark("input_source")
            self.read_paths: list[str] = []  # built extensions are handed to a side in its scratch directory
        self.quiet: Quiet | None = None  # calibrate_quiet(), by the thread that times
        self.oracle_unavailable = ""
        self.reference_peak = 0  # host memory the reference's side was seen holding (side_memory.py)
        self.ref: Side | None = None
        self.reference_started = False  # once: a later failure to start it is not the task's (start_reference)
        self.start_reference()
        mark("reference")

    def calibrate_quiet(self) -> Quiet:
        """The idle probe, calibrated once, before the task's first timed window, by the thread that
        times, with every warming spare and background side stopped: a task prepared ahead in a
        helper thread would calibrate it while another candidate's checks keep the device busy, and
        a probe calibrated on a busy device ends windows before the device is idle. Nothing is timed
        while a fork server's second stage still imports, unless the sides are pinned to a core of a
        host with idle cores to spare (fork_server.wait_for_imports)."""
        fork_server.wait_for_imports(pinned_core=self.timed_core)
        if self.quiet is None:
            with self.supply.stopped():
                self.quiet = Quiet(self.device, flush=self.config.timing.flush_cache, core=self.core)
        return self.quiet

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
        ref = self.ref  # (None once an evaluation on a CPU ended it: evaluator._settle_reference)
        if ref is not None:  # now, and the most its watchdog saw during the windows
            held = ref.proc.memory_bytes()
            self.reference_peak = max(self.reference_peak, held, ref.proc.peak_memory)
        return side_memory.candidate_limit(self.config.sandbox, self.reference_peak)

    def candidate_setup(self, source: str) -> Setup:
        """How a candidate's side loads `source`: the reference's init arguments, seed and module mode."""
        return Setup("candidate", source, self.task.source, "ModelNew", self.init_seed, self.threads,
                     self.config.module_mode, self.heap_reserve_bytes)

    def start_reference(self) -> None:
        """The reference's side, loaded (in a helper thread too: it works in the background, stopped for
        every timed window of the worker, until it is stopped for good here).

        A reference that does not start the first time raises a TaskError: bad input for `cuda-l1
        eval`, which judges in its own process; a pool's worker answers it as the evaluation's failure,
        judged again later (only a BrokenTask ends a bench: a sandbox can fail for reasons a candidate
        beside it provoked). Once it has started, a later start that fails (after a candidate crashed
        the side beside it, say) is the evaluation's failure everywhere, a RuntimeError."""
        try:
            self._start_reference()
        except TaskError as exc:
            if not self.reference_started:
                raise
            raise RuntimeError(f"the reference's side, started before for this task, did not start again: "
                               f"{exc}") from None
        self.reference_started = True

    def _start_reference(self) -> None:
        gate = self.supply.gate
        t0 = time.perf_counter()
        with gate:  # taken and tracked at once: no window runs between the two
            proc = self.start_side(side_memory.reference_limit(self.config.sandbox))
            self.supply.track(proc)
        t1 = time.perf_counter()
        origin = self.task.origin or self.task.name
        buffer = None
        try:
            setup = Setup("reference", self.task.source, self.task.source, "Model", self.init_seed, self.threads,
                          self.config.module_mode, self.heap_reserve_bytes)
            loaded, _ = load_side(proc, setup, self.config.load_timeout_s, self.build, gate=gate)
            if not loaded.ok:
                raise TaskError("the reference does not load in the sandbox:\n" + loaded.message[-3000:], path=origin)
            t2 = time.perf_counter()
            with gate:
                stop_failure = self.supply.untrack(proc)
                if stop_failure is not None:
                    raise stop_failure
                buffer = SlotBuffer(self.source, self.n_slots, proc.inputs_fd)
                mapped = proc.request(buffer.message(), self.config.call_timeout_s, Mapped)
                self.setup_phases.update({"reference_side": t1 - t0, "reference_load": t2 - t1,
                                          "reference_map": time.perf_counter() - t2})
                if not mapped.ok:
                    raise RuntimeError("the reference's side could not map its inputs: " + mapped.message)
                self.ref = Side("reference", proc, buffer, RemoteMemory(self.device, proc.harness_pid,
                                                                        self.max_output_bytes))
                self.ref.input_ranges, self.ref.ring = mapped_inputs(self.ref), gating.ring_page(proc, mapped)
                self.note_reference_memory()
                proc.freeze()
        except ChildFailure as failure:
            failure = self.supply.untrack(proc) or failure
            log = proc.close(graceful=False)
            self._drop_slots(buffer)
            raise TaskError(f"the reference cannot run in the sandbox: {failure}\n{log[-2000:]}", path=origin) from None
        except BaseException:
            self.supply.untrack(proc)
            proc.close(graceful=False)
            self._drop_slots(buffer)
            raise

    def _drop_slots(self, buffer: SlotBuffer | None) -> None:
        """A reference side that failed to start gives its input slots back (on a GPU up to two fifths of
        its memory, allocated outside torch's cache), whether or not it became the task's side."""
        if self.ref is not None and self.ref.buffer is buffer:
            self.ref.memory.close()
            if self.ref.ring is not None:
                self.ref.ring.close()
            self.ref = None
        if buffer is not None:
            with contextlib.suppress(RuntimeError):  # a device in error: the failure being raised stands
                buffer.close()

    def restart_reference(self) -> None:
        self.close_reference()
        self.start_reference()

    def fresh_inputs(self, count: int):
        """`count` calls' fresh inputs (inputs.RoundInputs), made on the device and synchronised. The
        task's get_inputs failing here (raising, changing its inputs' layout, running past its deadline)
        is the task's: BrokenTask, bad input, where it was the candidate's runtime_error, judged again.
        Running out of device memory, or another device error, is not (a candidate's side holds memory)."""
        origin = self.task.origin or self.task.name
        # A task prepared beside it seeds torch's generator (inputs.py); get_inputs is the task's code.
        with self.supply.gate, running_task_code(self.task.id, limit_s=self.config.task_timeout_s + GRACE_S):
            try:
                with task_deadline(self.config.task_timeout_s, "the task's inputs (get_inputs) for a round", origin):
                    inputs = self.source.fresh(count)
            except TaskError as exc:
                raise BrokenTask(str(exc)) from None
            except TASK_FAILURES as exc:
                if not is_task_failure(exc):
                    raise BrokenTask(_escaped(exc, origin), path=origin) from None
                if _device_trouble(exc):
                    raise
                raise BrokenTask(f"get_inputs() raised for a round after its first: {describe_exception(exc)}",
                                 path=origin) from None
            self.sync()
        return inputs

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)

    def close_reference(self, graceful: bool = True) -> None:
        """End the reference's side and give back what the parent holds for it. It is let go first and every
        part is closed whatever another raised: a device in error (a side ended for a fault) fails giving
        back its input buffer, which left the dead side in place, its ring open, for the next evaluation
        to trip over. Such a device error is not raised: the parent's health check reports the device."""
        ref, self.ref = self.ref, None
        if ref is None:
            return
        try:
            ref.memory.close()
            ref.proc.close(graceful=graceful)
        finally:
            try:
                with contextlib.suppress(RuntimeError):
                    ref.buffer.close()
            finally:
                if ref.ring is not None:
                    ref.ring.close()

    def close(self) -> None:
        self.close_reference()


def prime_supply(supply: SideSupply, config: EvalConfig) -> None:
    """Start a worker's spares before its first task: the kind its tasks will ask for (no readable
    paths, the timing core as TaskEnv picks it), any memory limit (set again when handed out)."""
    if not supply.prewarm:
        return
    core = timing_core(config)
    kind = SideKind(repr(config.sandbox), config.device, (), core)
    supply.prime(kind, lambda lim: SideProcess.start(config.sandbox, config.device, [], core, memory_limit=lim),
                 config.sandbox.memory_bytes)
