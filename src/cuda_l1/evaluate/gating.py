"""The per-call doorbell of a CPU window, the parent's half (the side's half and the record's layout:
doorbell.py). Slot 0's inputs are written before the window; after call k rings, the parent reads a
few positions of the outputs the ring names, writes slot k+1's inputs and says go.

Two defences, each useless without the other:
- gating (call k+1's inputs are written only after call k rang) keeps a call from seeing later
  calls' inputs, so no call can compute the rest of the window ahead as one batch;
- stability (the outputs a ring names are read at a few positions drawn at the ring, and after the
  window the reply must describe the same memory, holding the same bytes there) keeps a side from
  ringing at once with outputs not yet computed and computing every call in the last one, where all
  inputs are in: gating alone would still let it batch, at the end of the window instead of the start.
A ring costs both sides the same (and the null windows ring as often as a window calls), so an
honest candidate's speedup does not move; what gating costs a batching candidate is its batch.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import random
import secrets
import signal
import stat
import time
from dataclasses import dataclass

from cuda_l1.evaluate import sigstop
from cuda_l1.evaluate.doorbell import (ASLEEP_OFFSET, F_GET_SEALS, F_SEAL_SHRINK, FUTEX_WAIT, FUTEX_WAKE, GO_OFFSET, NAP,
                                       PAGE_BYTES, RING_LEAVES, RING_WORDS, futex_call, leaf_span)
from cuda_l1.evaluate.protocol import CallOutputs, Ran
from cuda_l1.evaluate.remote import SpotReader, Unreadable, read_spans
from cuda_l1.evaluate.sandbox import ChildFailure
from cuda_l1.evaluate.verdict import REJECTED, TIMEOUT

# Slots of this many bytes or more are written while the side is stopped (Gate._answer): a copy of
# 64 KiB takes about 5 us here, so below it whatever a side could do during the copy is that short.
STOP_BYTES = 64 * 1024
SPOTS = 8  # positions read at each ring, or one for each output a ring names where it names more
SPOT_BYTES = 8  # bytes read at each position (fewer where an output is smaller)
SPIN_MIN_S, SPIN_MAX_S = 30e-6, 1e-3  # how long the parent polls after each go (spin_for)
_CHECK_S = 200e-6  # while polling, how often the channel is looked at (a system call)
_PREEMPTED_S = 200e-6  # a gap this long in the polling loop: another task has the parent's core
_rng = random.Random(secrets.randbits(64))  # the parent's: where it reads is drawn where no side sees it


class RingFailure(ChildFailure):
    """A side that broke the doorbell's protocol (its verdict's check: `doorbell`)."""

    check = "doorbell"


@dataclass
class Rung:
    """What the parent saw when a call rang."""

    spans: tuple  # (address, nbytes) of the tensor outputs the ring named (the first RING_LEAVES)
    leaves: int  # tensor outputs it counted
    spots: list  # (address, bytes) read at the ring
    seen: bytes | None  # what they held then (None: unreadable)


class RingPage:
    """The parent's mapping of a side's doorbell page (doorbell.py), opened once through /proc: a
    memfd sealed against shrinking, of a page at least, or the side is refused."""

    def __init__(self, proc, fd_number: int):
        try:
            fd = os.open(f"/proc/{proc.harness_pid()}/fd/{int(fd_number)}", os.O_RDWR | os.O_CLOEXEC)
        except (OSError, ValueError) as exc:
            raise RingFailure(REJECTED, f"the side's doorbell page cannot be opened ({exc})") from None
        try:
            info = os.fstat(fd)
            try:
                sealed = fcntl.fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK
            except OSError:
                sealed = 0
            if not stat.S_ISREG(info.st_mode) or info.st_size < PAGE_BYTES or not sealed:
                raise RingFailure(REJECTED, "the side's doorbell page is not a memfd sealed against shrinking")
            self.address = _libc().mmap(None, PAGE_BYTES, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        finally:
            os.close(fd)
        if self.address in (None, ctypes.c_void_p(-1).value):
            self.address = None
            raise RingFailure(REJECTED, "the side's doorbell page cannot be mapped")
        self.words = (ctypes.c_uint64 * RING_WORDS).from_address(self.address)  # only ever read
        self.go_at = self.address + GO_OFFSET
        self.go = ctypes.c_uint64.from_address(self.go_at)  # only ever written
        self.asleep = ctypes.c_uint64.from_address(self.address + ASLEEP_OFFSET)  # only ever written

    def close(self) -> None:
        if self.address is not None:
            self.words = self.go = self.asleep = None
            address, self.address = self.address, None
            _libc().munmap(ctypes.c_void_p(address), PAGE_BYTES)


def _libc():
    """libc with mmap/munmap declared (pointers as pointers, sizes as size_t)."""
    global _LIBC
    if _LIBC is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _LIBC = lib
    return _LIBC


_LIBC = None


STOP_WAIT_S = 1.0  # how long a side may take to stop at a ring (an honest one sleeps on its go: microseconds)
STOP_SPIN_S = 200e-6  # of which polled without sleeping


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # ended (whatever it was doing is over), or its pid is another user's now


def halt(group, tree: list[int], timeout_s: float, spin_s: float = STOP_SPIN_S) -> bool:
    """Stop a side (through its cgroup's freezer, else by SIGSTOP to each process of `tree`) and return
    once the kernel reports every task of it (of `tree`'s processes, without a cgroup) stopped: True,
    or False when that took over `timeout_s`. Polled without sleeping for `spin_s` first (0 where the
    parent shares the side's core: its polling would hold up the very stop it waits for)."""
    if group is not None:
        return group.freeze(timeout_s, spin_s=spin_s)
    _signal(tree, signal.SIGSTOP)
    return sigstop.wait_stopped(tree, timeout_s, spin_s)


def spin_for(reference_window) -> float:
    """How long the parent polls for a ring before it sleeps, the same for both sides: twice a call
    of the reference's last window, within [30 us, 1 ms] (1 ms before one is known).

    A ring is seen within ~2 us by polling and 30-70 us after a futex sleep
    (benchmarks/wake_latency.py). Were one side's calls polled for and the other's slept on, the
    wake-up would count for one of them only: with a fixed 30 us, a candidate of 20 us a call
    against a reference of 40 us would read (40+30)/20 = 3.5x for 2x. Covering the reference's
    calls twice over, every call of a candidate up to twice as slow as the reference is polled
    for on both sides; past 1 ms, where both sleep, the wake-up is at most a few percent of a call.
    What it costs: the parent's core for the polling, up to 1 ms a call, which with two CPU workers
    on two cores is time the other worker's side loses (alike for both of its sides)."""
    if reference_window is None or not reference_window.calls:
        return SPIN_MAX_S
    return min(SPIN_MAX_S, max(SPIN_MIN_S, 2 * reference_window.reply_s / reference_window.calls))


def ring_page(proc, mapped) -> RingPage | None:
    """The ring page of a CPU side that mapped its inputs (None on a GPU, where there is no doorbell)."""
    return RingPage(proc, mapped.ring_fd) if proc.device == "cpu" else None


@contextlib.contextmanager
def wait_cores(core: int | None, busy: tuple[int, ...] = ()):
    """Where the parent's thread waits for rings during a window, and whether it may poll (yielded).

    It keeps off the core the sides are timed on (it polls while the side runs and must not take
    that core from it; the cache flush pins it there just before) and off `busy`, the cores other
    CPU workers of the pool time on: polling there took their sides' core for up to 1 ms a call
    (two workers on two cores, each parent on the other's timed core, read a 24x candidate as 1.0-1.7x).
    Where that leaves no core, the parent waits on the timed core itself and neither it nor the
    side polls: each sleeps on its futex and hands the core to the other (a switch on one core,
    the same for both sides)."""
    if core is None or not hasattr(os, "sched_setaffinity"):
        yield True
        return
    allowed = os.sched_getaffinity(0)
    others = allowed - {core} - set(busy)
    os.sched_setaffinity(0, others or {core} & allowed or allowed)
    try:
        yield bool(others)
    finally:
        os.sched_setaffinity(0, allowed)


class Gate:
    """The parent's half of one window's doorbell: `rings` rings (a window's calls, or a null
    window's rings), slot k+1 written after ring k by `write_slot`."""

    def __init__(self, side, slots: list[int], rings: int, write_slot, spin_s: float = SPIN_MAX_S):
        self.proc, self.buffer, self.write_slot = side.proc, side.buffer, write_slot
        self.slots = slots if slots else list(range(rings))
        self.n, self.k = rings, 0
        self.base = side.next_seq  # ring k is base+k+1, and so is the go for slot k+1
        side.next_seq += rings + 1
        if side.ring is None:
            raise self._fail("the side has no doorbell")
        self.words, self.address = side.ring.words, side.ring.address
        self.go, self.go_at, self.asleep = side.ring.go, side.ring.go_at, side.ring.asleep
        self.pid = side.proc.harness_pid()
        self.spin_s = spin_s
        self.polls = spin_s > 0  # the parent polls on a core of its own (gating.wait_cores); else it must sleep
        self.futex = futex_call()
        self.spot_reader = SpotReader(self.pid, max(SPOTS, RING_LEAVES), SPOT_BYTES)
        self.draw = _rng.getrandbits
        self.rungs: list[Rung] = []
        # The side's processes as it was last stopped (its whole tree), stopped while the parent
        # answers a ring when a slot is large (_answer); the same for null windows as for calls.
        self.stops = side.buffer.source.slot_bytes >= STOP_BYTES
        # Its cgroup's freezer where the side was frozen through it: no signal undoes a frozen group,
        # and a process forked meanwhile is frozen with it. Else SIGSTOP to each process listed.
        self.group = getattr(side.proc, "freezer", None)
        self.tree = sorted(side.proc.frozen) or [self.pid]
        self.tree_known = bool(side.proc.frozen)  # a side never stopped before has no listing to compare

    def _fail(self, why: str) -> RingFailure:
        self.proc.kill("broke the doorbell protocol")
        return RingFailure(REJECTED, why)

    def _rung(self) -> bool:
        """Whether call k has rung (its record is whole); a record out of order ends the window."""
        words = self.words
        seq, want = words[0], self.base + self.k + 1
        if seq == want:
            return words[RING_WORDS - 1] == want  # else: read while being written; read again
        if seq == want - 1 or seq <= self.base:  # the last ring, or one from before this window
            return False
        raise self._fail(f"the side rang out of order (ring {seq - self.base} of the window where "
                         f"{self.k + 1} was due)")

    def _wait(self, deadline: float) -> bool:
        """Until call k rings (True) or a frame arrives first (False): polled for `spin_s` (a word
        of the shared page: no system call but a look at the channel every 200 us), then asleep on
        the ring's futex, which the side wakes when it rings; every 20 ms (every 20 us where there
        is no futex) the channel and the side's limits are looked at. A poll that finds the parent
        was descheduled (another task wants its core) ends polling for the rest of the window: a
        sleeper is woken at once, a poller waits out the other task's time slice."""
        start = last = time.perf_counter()
        check_at, watch_at = start + _CHECK_S, time.monotonic() + 0.25
        while True:
            if self._rung():
                return True
            now = time.perf_counter()
            if now - last > _PREEMPTED_S:
                self.spin_s = 0.0
            last = now
            if now - start < self.spin_s:
                if now < check_at:
                    continue
                check_at = now + _CHECK_S
            else:
                # Said before the ring is read: a side that rings now either sees it and wakes the
                # futex, or its ring is seen by futex_wait, which then does not sleep (doorbell._publish).
                self.asleep.value = 1
                seq = self.words[0]
                if self._rung():
                    self.asleep.value = 0
                    return True
                if self.futex is not None:
                    self.futex(self.address, FUTEX_WAIT, seq & 0xFFFFFFFF, NAP, None, 0)
                else:
                    time.sleep(20e-6)
                self.asleep.value = 0
                if self._rung():
                    return True
                last = time.perf_counter()  # asleep on purpose: no sign of another task
            if self.proc.chan.has_pending():
                return self._rung()  # a ring written before the frame was sent is seen now
            now = time.monotonic()
            if now > deadline:
                self.proc.kill("timed out")
                raise ChildFailure(TIMEOUT, f"call {self.k + 1} of a window did not return within its limit")
            if now > watch_at:
                watch_at = now + 0.25
                self.proc.watch()

    def _answer(self) -> None:
        """Call k rang: read its spots, write slot k+1's inputs, say go, then keep what was seen.

        Where slots are large (STOP_BYTES) the side is stopped for all of it and let go after the go:
        through its cgroup's freezer where it has one, else by SIGSTOP to each of its processes; either
        way the parent waits until the kernel reports it stopped (halt). A task is stopped only on its
        way back to user space, so a system call made right after the ring (a preadv of the input
        buffer's file reaching into the next slot) would run on through the copy if not waited for: it
        read the next call's inputs as they landed (an honest side sleeps on its go and stops at once).
        The side maps its inputs from the same pages the parent writes, so it can watch a copy land, and the null
        windows take the answer's time off both sides: running through it, a candidate summed each
        row of its next input as soon as the copy had passed it, and read 2.9-3.6x for kernels that
        alone read 0.86-0.92 (corpus case stream_during_copy); one that polled for its go where the
        honest harness sleeps saved a wake-up a call (poll_for_go). A stopped side does neither.
        (Without a cgroup, one process of the side can SIGCONT another before it is stopped itself,
        and a process started and ended inside one window is never listed: docs/isolation.md.)"""
        stopped = self.stops and self.k + 1 < self.n
        try:
            if stopped:
                self._stop(True)
            self._answer_stopped()
        finally:
            if stopped:
                self._stop(False)
        if self.k < self.n and self.futex is not None:
            self.futex(self.go_at, FUTEX_WAKE, 1, None, None, 0)

    def _stop(self, stop: bool) -> None:
        if not stop:
            if self.group is not None:
                self.group.set_frozen(False)
            else:
                _signal(self.tree, signal.SIGCONT)
            return
        if not halt(self.group, self.tree, STOP_WAIT_S, STOP_SPIN_S if self.polls else 0.0):
            self.proc.kill("could not be stopped at a ring")
            raise RingFailure(REJECTED, f"the side was still running {STOP_WAIT_S:.0f} s after a ring, where it is "
                              "stopped while its next inputs are written")

    def _answer_stopped(self) -> None:
        # One copy of what the record names (the side may write the page while it runs), as short as
        # the count it says: a copy of the whole record costs microseconds a ring.
        named = min(self.words[1], RING_LEAVES)
        words = self.words[:2 + 2 * named]
        leaves = words[1]
        spans = tuple((words[2 + 2 * i], words[3 + 2 * i]) for i in range(min(leaves, named)))
        spots = self._spots(spans)
        try:
            seen = self.spot_reader.read(spots)
        except Unreadable:
            seen = None
        self.k += 1
        if self.k < self.n:
            self.write_slot(self.slots[self.k])
            self.go.value = self.base + self.k
        self.rungs.append(Rung(spans, leaves, spots, seen))

    def _spots(self, spans: tuple) -> list[tuple[int, int]]:
        """SPOTS positions drawn now over the outputs a ring named (one for each output where it
        named more: an output seen at only some rings could be finished later at the others), SPOT_BYTES each."""
        outputs = [s for s in spans if s[1]]
        if not outputs:
            return []
        spots, draw, first = [], self.draw, self.draw(16) % len(outputs)
        for i in range(max(SPOTS, len(outputs))):  # every output gets one before any gets two, from one drawn now
            address, nbytes = outputs[(first + i) % len(outputs)]
            width = min(SPOT_BYTES, nbytes)
            spots.append((address + draw(64) % (nbytes - width + 1), width))
        return spots

    def reply(self, timeout_s: float, max_bytes: int) -> bytes:
        """Answer rings until every call rang or a frame came first; then the next frame (refused
        from its header when longer than max_bytes)."""
        deadline = time.monotonic() + timeout_s
        while self.k < self.n and self._wait(deadline):
            self._answer()
        return self.proc.recv_frame(max(deadline - time.monotonic(), 0.01), max_bytes)

    def finish(self, ran: Ran, first: bool = False) -> None:
        """After the window: a reply whose calls all ran must have come after every ring. Stopped by
        signals, a side that started a process during a window (not the first, which is not timed and
        may start a compiler's workers) is refused: the new process was not among those stopped."""
        if ran.ok and self.k < self.n:
            raise self._fail(f"the side replied after ringing for {self.k} of the window's {self.n} calls")
        if (self.stops and self.group is None and self.tree_known and not first
                and set(self.proc.frozen) - set(self.tree)):
            raise self._fail("the side started a process during a window (its inputs are written while "
                             "the side's processes are stopped, and a new one would not be)")


def unstable(rungs: list[Rung], calls: list[CallOutputs], pid: int) -> tuple[str, str] | None:
    """(check, reason) when a call's outputs are not what it rang with: described elsewhere, unreadable
    at the ring, or changed since (an output finished after its call returned); None when all held."""
    for k, (rung, call) in enumerate(zip(rungs, calls)):
        spans = [leaf_span(leaf) for leaf in call.leaves if leaf.kind == "tensor"]
        if len(spans) != rung.leaves or tuple(spans[:RING_LEAVES]) != rung.spans:
            return ("outputs_stable", f"call {k + 1}'s outputs are described in other memory than its ring "
                    "named when the call returned (or in another layout than the window's first call's, "
                    "after earlier windows kept one)")
        if rung.seen is None:
            return "outputs_readable", f"call {k + 1}'s outputs could not be read when the call returned"
    try:
        now = read_spans(pid, [spot for rung in rungs for spot in rung.spots])
    except Unreadable as exc:
        return "outputs_readable", f"outputs could not be read after the window ({exc})"
    at = 0
    for k, rung in enumerate(rungs):
        n = len(rung.seen)
        if now[at:at + n] != rung.seen:
            return ("outputs_stable", f"call {k + 1}'s output changed after the call returned (it was not "
                    "computed, or not finished, when the call rang)")
        at += n
    return None
