"""A side as the referee uses it, and the steps around a window: loading its module (with the
parent's builds) and checking, from outside, that it left its inputs alone."""

from __future__ import annotations

import collections
import contextlib
import os
import select
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable

from cuda_l1.evaluate import output_memory, sigstop, timing
from cuda_l1.evaluate.channel import ChannelClosed, ChannelError, ChannelTimeout
from cuda_l1.evaluate.protocol import BuildReply, BuildRequest, Confined, Loaded, Ran, Setup
from cuda_l1.evaluate.remote import RemoteMemory, file_mappings, input_mappings, inputs_unchanged
from cuda_l1.evaluate.sandbox import ChildFailure, SideProcess
from cuda_l1.evaluate.slots import RoundInputs, SlotBuffer
from cuda_l1.evaluate.verdict import REJECTED, RUNTIME_ERROR, TIMEOUT


class ReferenceFailure(Exception):
    """The reference's own side failed (while a candidate was being judged, or while setting up).
    `kind`: the verdict it gives the candidate judged then (runtime_error, or timeout when what ran out
    was the candidate's own evaluation time, not the reference's allowance for the request); `check`:
    the check it fails (another than reference_ran where the candidate made it fail, e.g. memory it
    named that faulted when read). The reference's side is replaced after it either way."""

    def __init__(self, message: str, kind: str = RUNTIME_ERROR, check: str = "reference_ran",
                 device_fault: bool = False):
        super().__init__(message)
        self.kind = kind
        self.check = check  # reference_ran: the evaluation failed; another: the candidate's own failure
        self.device_fault = device_fault  # the side's context was lost reading memory the candidate named


@dataclass
class Side:
    """One side as the referee uses it: its process, its input buffer and a reader of its memory."""

    name: str  # "reference" | "candidate"
    proc: SideProcess
    buffer: SlotBuffer
    memory: RemoteMemory
    ran: Ran | None = None
    window: timing.Window | None = None
    input_ranges: list = field(default_factory=list)
    # outputs per call in its last reply that described calls (a null window's describes none)
    leaves_per_call: int | None = None
    ring: object = None  # CPU: the parent's mapping of the side's ring page (gating.RingPage)
    next_seq: int = 1  # the doorbell's next sequence number (never reused: stale words are told apart)
    rungs: list | None = None  # what the parent saw at each ring of the last window (gating.Rung)
    # the harness's own work per call, as its windows reported it (Ran.harness_s; trusted of the reference)
    harness_per_call: collections.deque = field(default_factory=lambda: collections.deque(maxlen=256))


MAX_BUILDS = 16  # extension builds one module may ask for


def load_side(proc: SideProcess, setup: Setup, timeout_s: float, build: Callable | None,
              gate=None) -> tuple[Loaded, list[dict]]:
    """Send the setup and serve build requests until the side says whether its module loaded.
    Builds run in the parent's time: each is bounded by what is left of `timeout_s`, and there are at
    most MAX_BUILDS of them.

    `gate` (a helper thread's: side_supply.SideSupply.gate): held for every step but the waits and
    the builds, and a message is read under it only once whole, so a timed window of the worker's
    never waits on this side for more than a moment."""
    hold = gate if gate is not None else contextlib.nullcontext()
    deadline = time.monotonic() + timeout_s
    if proc.device == "cpu":
        _note_harness_threads(proc, deadline)
    with hold:
        proc.send(setup)
    builds, confined = [], False
    while True:
        if gate is None:
            msg = proc.recv(max(deadline - time.monotonic(), 0.01))
        else:
            msg = _next_message(proc, deadline, gate)
        if isinstance(msg, Confined) and not confined:
            # Only the report sent before the module was imported counts.
            confined = True
            proc.notes = dict(msg.sandbox)
        elif isinstance(msg, BuildRequest) and confined:
            serve_build(proc, msg, build, builds, deadline - time.monotonic(), hold)
        elif isinstance(msg, Loaded) and confined:
            return msg, builds
        else:
            with hold:
                proc.kill("broke the protocol")
            raise ChildFailure(REJECTED, f"unexpected message {type(msg).__name__} while loading")


def _note_harness_threads(proc: SideProcess, deadline: float) -> None:
    """The side's threads once its harness is done starting and before it has the module (only the
    harness's code ran: trusted), none of which may end (SideProcess.watch). Waiting for the start costs
    nothing: the module could not load sooner. A side not done starting by the deadline, or dead, has
    none noted; the load that follows reports it."""
    while not proc.started():
        if time.monotonic() >= deadline or proc.exit_info().reason != "running":
            return
        time.sleep(0.002)
    proc.harness_threads = frozenset(sigstop.thread_ids(proc.tree()))


def serve_build(proc: SideProcess, msg: BuildRequest, build: Callable | None, builds: list[dict], left_s: float,
                hold=None) -> None:
    """Build what the side asked for with the parent's trusted build layer (at most MAX_BUILDS for a
    module, whether asked while loading or, with a lazy `load_inline` in forward, during a window)
    and give it the result; `builds` gets a record of it. `hold`: the gate held for every step but
    the build itself."""
    hold = hold if hold is not None else contextlib.nullcontext()
    started = time.monotonic()
    if left_s <= 1.0:
        with hold:
            proc.kill("timed out")
        raise ChildFailure(TIMEOUT, "the module's extension builds took longer than its time allowed")
    if len(builds) >= MAX_BUILDS:  # answering every further request would let a module flood the parent
        with hold:
            proc.kill("asked for too many builds")
        raise ChildFailure(RUNTIME_ERROR, f"the module asked for more than {MAX_BUILDS} extension builds")
    if build is None:
        reply = {"ok": False, "log": "no builder"}
    else:
        reply = build({"args": msg.args, "kwargs": msg.kwargs}, timeout_s=left_s)  # a compiler: no gate
    with hold:
        if reply.get("ok") and reply.get("so_path"):
            reply = dict(reply, so_path=give_file(proc, reply["so_path"]))
        builds.append({"ok": reply.get("ok"), "cached": reply.get("cached"),
                       "seconds": round(time.monotonic() - started, 3)})
        proc.send(BuildReply(**{k: v for k, v in reply.items() if k in BuildReply.__dataclass_fields__ and v is not None}))


def as_ran(proc: SideProcess, msg) -> Ran:
    """A window's reply, which must be a Ran: a build asked for after the first window is the
    module's error (serve_build serves the first window's), any other message breaks the protocol."""
    if isinstance(msg, BuildRequest):
        proc.kill("asked for a build after its first window")
        raise ChildFailure(RUNTIME_ERROR, "the module asked for an extension build after its first call "
                           "(build in __init__ or in the first call)")
    if not isinstance(msg, Ran):
        proc.kill("broke the protocol")
        raise ChildFailure(REJECTED, f"the side answered {type(msg).__name__} where Ran was due")
    return msg


def _next_message(proc: SideProcess, deadline: float, gate):
    """The side's next message, waited for without the gate and read under it in short polls (a side
    that sends half a frame and stops cannot hold the gate); its limits are watched meanwhile."""
    chan = proc.chan
    chan.max_frame_bytes = 64 << 20  # as SideProcess.recv_frame: load messages are small
    stalled_at = -1  # bytes buffered when a read last found no whole frame
    while True:
        if time.monotonic() > deadline:
            with gate:
                proc.kill("timed out")
            raise ChildFailure(TIMEOUT, "the side did not finish loading within its limit")
        if chan.buffered() not in (0, stalled_at) or select.select([chan.read_fd], [], [], 0.25)[0]:
            with gate:
                try:  # a frame that arrived in part stays buffered; it is read again once more arrives
                    return proc.decode(chan.recv_frame(timeout=0.002))
                except ChannelTimeout:
                    stalled_at = chan.buffered()
                except ChannelClosed:
                    raise ChildFailure(RUNTIME_ERROR, proc._death_message()) from None
                except ChannelError as exc:
                    proc.kill("broke the protocol")
                    raise ChildFailure(REJECTED, f"the side sent an invalid frame ({exc})") from None
        else:
            with gate:
                proc.watch()


def give_file(proc: SideProcess, path: str) -> str:
    """Give the side a copy of a file of the parent's (a built extension) in its scratch directory, so
    the side never needs to read the build cache, where other candidates' sources and logs live.

    The side's own code has run by then and may have planted links in its scratch directory: the file
    goes into a directory made now under a fresh random name (mkdir never follows a link), opened
    without following links and checked to be the parent's, and is created in it exclusively. Where
    the scratch directory is the side's own tmpfs, the parent reaches it through the side's root, and
    a link followed there would resolve in the parent's filesystem."""
    hpid = proc.harness_pid()
    root = f"/proc/{hpid}/root" if hpid and "scratch tmpfs" in proc.notes.get("mounts", "") else ""
    where = os.path.join(proc.scratch, "ext-" + secrets.token_hex(8))
    name = os.path.basename(path)
    # The parent's own file is opened first and outside what is blamed on the side: it is missing only
    # where the parent's cache lost it (trimmed by another run), which is the evaluation's failure.
    with open(path, "rb") as src:
        _place_in_scratch(src, root + where, name)
    return os.path.join(where, name)


def _place_in_scratch(src, where: str, name: str) -> None:
    """Make the directory `where` in the side's scratch and copy `src` into it as `name`."""
    try:
        os.mkdir(where, 0o700)
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ChildFailure(REJECTED, f"the side's scratch directory could not take its extension ({exc})") from None
    try:
        if os.fstat(fd).st_uid != os.getuid():
            raise ChildFailure(REJECTED, "the side replaced the directory made for its extension")
        # The directory is the candidate's (its scratch, which its code may have filled or raced into):
        # a failure there is its own, never the evaluation's, which would be judged again and never a hack.
        try:
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755, dir_fd=fd)
        except FileExistsError:
            raise ChildFailure(REJECTED, "the side made the file of its extension before the parent did") from None
        except OSError as exc:
            raise ChildFailure(RUNTIME_ERROR, f"the side's scratch directory could not take its extension ({exc})") from None
        with os.fdopen(out, "wb", buffering=0) as dst:
            _copy_into(src, dst)
        try:
            os.fchmod(fd, 0o755)
        except OSError as exc:
            raise ChildFailure(RUNTIME_ERROR, f"the side's scratch directory could not take its extension ({exc})") from None
    finally:
        os.close(fd)


def _copy_into(src, dst) -> None:
    """Copy the parent's file into the side's: a failed read is the parent's (an ordinary error, judged
    again), a failed write the side's (its scratch is full or raced: ENOSPC)."""
    while chunk := src.read(1 << 20):
        try:
            view = memoryview(chunk)
            while view:  # (unbuffered: a short write is possible)
                written = dst.write(view)
                if not written:
                    raise OSError("no byte written")
                view = view[written:]
        except OSError as exc:
            raise ChildFailure(RUNTIME_ERROR, f"the side's scratch directory could not take its extension ({exc})") from None


def mapped_inputs(side: Side) -> list[tuple[int, int]]:
    """Where a CPU side mapped its input buffer, as the kernel lists it (empty on CUDA)."""
    pid = side.proc.harness_pid()
    if side.proc.device != "cpu" or not pid or side.proc.inputs_fd < 0:
        return []
    st = os.fstat(side.proc.inputs_fd)
    ranges = input_mappings(pid, (st.st_dev, st.st_ino))
    # The buffer is mapped once, whole and privately; anything else is not the harness's doing.
    if len(ranges) != 1 or not ranges[0][2]:
        raise ChildFailure(REJECTED, "the side's input buffer is not mapped as the harness maps it")
    return [ranges[0][:2]]


def placed_outputs(side: Side) -> tuple[list, tuple[str, str] | None]:
    """The calls of a side's last window, a CPU side's outputs placed where their memory is
    (output_memory.physical), and what is wrong with its memory (check, reason), if anything: its input
    buffer mapped again, elsewhere or shared (a second mapping gives outputs that are views of the
    inputs), or an output reaching out of a mapping of a file."""
    calls = side.ran.calls
    if side.proc.device != "cpu" or not side.input_ranges:
        return calls, None
    try:
        now = mapped_inputs(side)
    except ChildFailure:  # not mapped once, whole
        now = None
    if now != side.input_ranges:
        return calls, ("no_input_aliasing", "the side mapped its input buffer again, or elsewhere")
    files = file_mappings(side.proc.harness_pid())
    placed = [output_memory.physical(call, files) for call in calls] if files is not None else [None]
    if None in placed:
        return calls, ("output_ownership", "an output reaches from a mapping of a file into other memory, or the "
                       "side's memory map could not be read")
    return placed, None


def changed_inputs(side: Side, slots: list[int], pristine: RoundInputs) -> list[int]:
    """Slots whose inputs the side changed during its window. On CUDA the side maps the parent's own
    allocation, so the parent's view shows any write (one comparison for a window's slots, slot by
    slot only to say which one); on CPU the side's private mapping is read back."""
    if side.proc.device != "cpu":
        if pristine.packed is not None and slots == list(range(len(slots))):
            if side.buffer.holds_packed(pristine.packed, len(slots)):
                return []
            changed = [k for k in slots if not side.buffer.unchanged(k, pristine[k])]
            return changed or [slots[0]]  # only padding between inputs changed: still a write to them
        return [k for k in slots if not side.buffer.unchanged(k, pristine[k])]
    pid = side.proc.harness_pid()
    return [k for k in slots if pid is None or not inputs_unchanged(pid, side.input_ranges, side.buffer.leaf_ranges(k), pristine[k])]


def side_estimate(side: Side) -> float:
    """Seconds the side's last window took (0 before its first)."""
    return side.window.wall_s if side.window else 0.0
