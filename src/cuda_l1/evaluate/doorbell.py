"""The per-call doorbell of a CPU window, the side's half: after each call the side rings (publishes
where the call's outputs are) and waits until the parent says go for the next one. The parent's half
is gating.py.

Why: a window is a batch of back-to-back calls, each on its own input slot. With every slot written
before the window, call 1 could see them all (`x.untyped_storage()` is the whole buffer) and compute
every call of the window as one batch (n GEMVs as one matrix product), the other calls returning
copies of their rows: verification after the window sees right values. So call k+1's inputs are
written only after call k has rung; until then its slot holds the previous round's values.

Both words live in one page, a memfd the side makes when it maps its inputs, seals against
shrinking and maps shared; the parent opens it once through /proc, checks the seal (so the side
cannot truncate it under the parent's mapping) and maps it too. The side writes the ring record,
the parent writes the go word; each polls the other's word for a short while (a load, no system
call) and then sleeps on a futex on it, which the writer wakes after every write (one system call,
~1 us, alike on both sides and in the null windows). The parent copies a record once before using
it and trusts nothing in it beyond gating.py's checks; a side that writes the go word itself only
reads a slot the parent has not written yet. Why sleep at all: a poller that shares its core with
another busy process is descheduled for whole time slices, where a futex sleeper is woken within
20-70 us (benchmarks/wake_latency.py); gating.spin_for says how long the parent polls. The side
polls for 100 us, long enough for the parent's answer to a ring unless a slot holds hundreds of
kilobytes, which the null windows write as well. (The go word first lived in a page of the inputs
memfd, which the side maps privately: a futex on it makes the kernel take a writable reference,
which breaks the side's copy-on-write mapping away from the parent's page.)
No per-call message goes over the authenticated channel: a frame costs 10-20 us.

Ring record, 64-bit little-endian words: [seq, tensor leaves, (address, nbytes) x RING_LEAVES, seq].
`address` is a tensor's first element and `nbytes` the bytes its view spans (the same as
`leaf_span` of the call's description in the reply, which the parent checks). The sequence number
is written twice, last at the front, so a record read while it is being written is seen as not yet
rung (stores are ordered on x86-64).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import mmap
import os
import platform
import threading
import time

from cuda_l1.evaluate.protocol import ITEMSIZE, CallOutputs, LeafRef

# Tensor leaves a ring names: the record's 203 words fit before GO_OFFSET. A call with more is checked
# at its rings on its first 100 only (16 once let a 17th output be computed later, batched, at 1.2-1.46x).
RING_LEAVES = 100
RING_WORDS = 3 + 2 * RING_LEAVES
PAGE_BYTES = 4096  # the doorbell page: the ring record from its start, the go word at GO_OFFSET
GO_OFFSET = 2048  # another cache line than the record's
ASLEEP_OFFSET = 3072  # the parent's word: 1 while it sleeps (or is about to) on the ring's futex
_SPIN_S = 100e-6  # how long the side polls the go word before it sleeps
_PREEMPTED_S = 200e-6  # a gap this long between two polls: this process was descheduled
F_ADD_SEALS, F_GET_SEALS = 1033, 1034
F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW = 0x1, 0x2, 0x4
FUTEX_WAIT, FUTEX_WAKE = 0, 1  # shared (not FUTEX_PRIVATE_FLAG): the two processes map one memfd
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}
_DUMMY_BYTES = 1 << 18  # what a null window's rings name: spread over pages like an output


def futex_call():
    """futex(2) through libc's syscall(), arguments declared (None where the machine is not known:
    the parent then wakes itself every 20 us to look, slower but the same for both sides)."""
    global _futex
    number = _SYS_FUTEX.get(platform.machine())
    if _futex is None and number is not None:
        fn = ctypes.CDLL(None, use_errno=True).syscall
        fn.restype = ctypes.c_long
        fn.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_uint32]
        _futex = functools.partial(fn, number)
    return _futex


_futex = None


class _Timespec(ctypes.Structure):
    _fields_ = [("seconds", ctypes.c_long), ("nanoseconds", ctypes.c_long)]


NAP = ctypes.byref(_Timespec(0, 20_000_000))  # a futex sleep's longest: then look again


def leaf_span(leaf: LeafRef) -> tuple[int, int]:
    """(address of the first element, bytes the view spans) of a CPU tensor leaf."""
    item = ITEMSIZE.get(leaf.dtype, 1)
    if leaf.numel() == 0:
        return leaf.address + leaf.storage_offset * item, 0
    last = sum((s - 1) * st for s, st in zip(leaf.shape, leaf.stride))
    return leaf.address + leaf.storage_offset * item, (last + 1) * item


class SideBell:
    """The side's doorbell page: the ring record (written) and the go word (read)."""

    def __init__(self):
        self.fd = os.memfd_create("cuda-l1-doorbell", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, PAGE_BYTES)
        fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
        self._attach(mmap.mmap(self.fd, PAGE_BYTES))

    def _attach(self, page: mmap.mmap) -> None:
        self.page = page
        self._scratch: SideBell | None = None
        self.record = (ctypes.c_uint64 * RING_WORDS).from_buffer(self.page)
        self.go = ctypes.c_uint64.from_buffer(self.page, GO_OFFSET)
        self.asleep = ctypes.c_uint64.from_buffer(self.page, ASLEEP_OFFSET)
        # A full barrier between publishing a ring and reading `asleep` (x86-64: a lock's acquire is a
        # locked instruction, ~0.1 us); elsewhere every ring wakes.
        self._fence = threading.Lock() if platform.machine() == "x86_64" else None
        self.dummy = (ctypes.c_char * _DUMMY_BYTES)()
        self._futex = futex_call()
        self._ring_at, self._go_at = ctypes.addressof(self.record), ctypes.addressof(self.go)

    def wait(self, seq: int, poll: bool = True) -> None:
        """Until the parent's go word reads `seq` (the next slot's inputs are written): polled for
        100 us (this side's own window time; not at all without `poll`, where the parent waits on
        this core), then asleep on its futex; a poll that finds this process was descheduled
        (another process wants the core) goes to sleep at once."""
        go, futex = self.go, self._futex
        start = last = time.perf_counter()
        spin = _SPIN_S if poll else -1.0
        while go.value != seq:
            now = time.perf_counter()
            if now - start > spin or now - last > _PREEMPTED_S:
                value = go.value
                if value == seq:
                    return
                if futex is None:
                    time.sleep(20e-6)
                else:
                    futex(self._go_at, FUTEX_WAIT, value & 0xFFFFFFFF, NAP, None, 0)
                start = -1.0  # sleep from now on
                now = time.perf_counter()
            last = now

    def harness_work_s(self, out, describer, repeats: int = 5) -> float:
        """The harness's own work in one call of a CPU window, the call itself and the waits for the parent
        left out: the go word read, the output kept, its pointers, the ring, its layout compared after the
        ring (child.Side._ring_calls). All of it runs in the candidate's process, where a loop of its own
        can skip it, so all of it is the bound of what skipping saves (timing.harness_cap); on the
        reference's side, which runs no candidate code, it is measured honestly. Timed warm (the median of
        `repeats`) on a page of this process's own (no parent reads it, so no ring wakes anyone)."""
        if self._scratch is None:
            self._scratch = ScratchBell()
        bell, spans, fast, confirm = self._scratch, describer.layout.spans, describer.pointers, describer.confirm
        varied, kept, samples = describer.varied, [], []
        seq = bell.go.value = bell.go.value + 1
        for _ in range(repeats):
            started = time.perf_counter()
            bell.wait(seq)
            kept.append(out)
            pointers = fast(out)
            if pointers is not None:
                bell.ring_pointers(seq + 1, pointers, spans)
                kept.append(confirm(out, pointers))
            samples.append(time.perf_counter() - started)
        describer.varied = varied  # (a timing, not a call: what it compared changes nothing)
        return sorted(samples)[repeats // 2]

    def ring(self, seq: int, call: CallOutputs) -> None:
        """Call done: where its tensor outputs are, then the sequence number (front word last)."""
        rec = self.record
        n = 0
        for leaf in call.leaves:
            if leaf.kind != "tensor":
                continue
            if n < RING_LEAVES:
                rec[2 + 2 * n], rec[3 + 2 * n] = leaf_span(leaf)
            n += 1
        rec[1] = n
        self._publish(seq)

    def ring_pointers(self, seq: int, pointers: list[int], spans: list[int]) -> None:
        """Call done, its tensors described by pointers (describe.py): the same record, from the
        first call's spans (at most RING_LEAVES tensors are ever described so)."""
        rec = self.record
        if len(pointers) == 1:  # the common case, written out: this is harness work in every call
            rec[2], rec[3] = pointers[0], spans[0]
        else:
            for i, (ptr, nbytes) in enumerate(zip(pointers, spans)):
                rec[2 + 2 * i], rec[3 + 2 * i] = ptr, nbytes
        rec[1] = len(pointers)
        self._publish(seq)

    def ring_empty(self, seq: int) -> None:
        """A null window's ring: the same record, naming memory of the harness's own, so the parent's
        work per ring (read the record, read a few positions) is what it is for a call."""
        rec = self.record
        rec[2], rec[3] = ctypes.addressof(self.dummy), _DUMMY_BYTES
        rec[1] = 1
        self._publish(seq)

    def _publish(self, seq: int) -> None:
        """The sequence number, then a wake only if the parent sleeps: a wake is a system call (~2 us
        through ctypes) that a loop of the candidate's own would skip while the parent polls, and the
        null windows' rings, which are subtracted, made it. Dekker's pattern: the side writes the ring
        and then reads `asleep`, the parent writes `asleep` and then (in futex_wait, past a barrier)
        reads the ring, each with a full barrier between, so at least one sees the other's write."""
        rec = self.record
        rec[RING_WORDS - 1] = seq
        rec[0] = seq
        if self._futex is None:
            return
        fence = self._fence
        if fence is not None:
            fence.acquire()
            fence.release()
            if not self.asleep.value:
                return
        self._futex(self._ring_at, FUTEX_WAKE, 1, None, None, 0)


class ScratchBell(SideBell):
    """A doorbell page of the side's own memory that no parent maps: where SideBell.harness_work_s rings."""

    def __init__(self):  # (no memfd: nothing outside this process reads it)
        self.fd = -1
        self._attach(mmap.mmap(-1, PAGE_BYTES))
