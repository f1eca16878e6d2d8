"""The per-call doorbell of a CPU window, the side's half: after each call the side rings (publishes
where the call's outputs are) and waits until the parent says go for the next one. The parent's half
is gating.py.

Why: a window is a batch of back-to-back calls, each on its own input slot. With every slot written
before the window, call 1 could see them all (`x.untyped_storage()` is the whole buffer) and compute
every call of the window as one batch (n GEMVs as one matrix product), the other calls returning
copies of their rows: verification after the window sees right values. So call k+1's inputs are
written only after call k has rung; until then its slot holds the previous round's values.

Where the two words live:
- the go word is in a control page of the inputs memfd, after the slots: the parent writes it
  through its own shared mapping, and the side's private (copy-on-write) mapping of the memfd sees
  the parent's writes on every page the side never wrote; the side spins on it (its own window
  time). A side that writes the page gets a copy of its own and never sees go: it times out.
- the ring record is in a one-page memfd the side makes and seals against shrinking, mapped shared;
  the parent opens it through /proc once, when the side maps its inputs, checks the seal (so the
  side cannot truncate it under the parent's mapping) and maps it read-only. After writing a record
  the side wakes the parent with a futex on the sequence word (one system call, ~1 us, the same on
  both sides); the parent polls the word for a while, then sleeps on that futex (gating.spin_for
  says how long, and why). A parent that only polls is descheduled for a whole time slice when
  another process wants its core, where a futex sleeper is woken within 20-70 us; polling through
  process_vm_readv would also cost a system call a look.
  The parent copies a record once before using it; nothing in it is trusted beyond gating.py's checks.
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
import time

from cuda_l1.evaluate.protocol import ITEMSIZE, CallOutputs, LeafRef

RING_LEAVES = 16  # tensor leaves a ring names; a call with more is checked on its first 16
RING_WORDS = 3 + 2 * RING_LEAVES
RING_BYTES = 8 * RING_WORDS
CONTROL_BYTES = 4096  # the control page after the slots (the go word is its first word)
_SPIN = 200_000  # go-word reads (~60 ns each: ~10 ms) before the side starts yielding its core
RING_PAGE = 4096  # the ring memfd's size
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


def control_offset(slots_bytes: int) -> int:
    """Where the control page starts: the first page boundary after the slots."""
    return (slots_bytes + CONTROL_BYTES - 1) // CONTROL_BYTES * CONTROL_BYTES


def leaf_span(leaf: LeafRef) -> tuple[int, int]:
    """(address of the first element, bytes the view spans) of a CPU tensor leaf."""
    item = ITEMSIZE.get(leaf.dtype, 1)
    if leaf.numel() == 0:
        return leaf.address + leaf.storage_offset * item, 0
    last = sum((s - 1) * st for s, st in zip(leaf.shape, leaf.stride))
    return leaf.address + leaf.storage_offset * item, (last + 1) * item


class SideBell:
    """The side's doorbell: the go word (read) and the ring record (written, in a page it shares)."""

    def __init__(self, mapping, control: int):
        self.go = ctypes.c_uint64.from_buffer(mapping, control)  # only ever read: no copy-on-write
        self.fd = os.memfd_create("cuda-l1-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, RING_PAGE)
        fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
        self.page = mmap.mmap(self.fd, RING_PAGE)
        self.record = (ctypes.c_uint64 * RING_WORDS).from_buffer(self.page)
        self.dummy = (ctypes.c_char * _DUMMY_BYTES)()
        self._wake = futex_call()
        self._at = ctypes.addressof(self.record)

    def wait(self, seq: int) -> None:
        """Until the parent's go word reads `seq` (the next slot's inputs are written). Spinning is
        this side's own window time; the parent is kept off this core while it polls. After a
        while (large inputs being written) it yields, then sleeps: the parent may be gone."""
        go = self.go
        spins = 0
        while go.value != seq:
            spins += 1
            if spins > _SPIN:
                os.sched_yield()
                if spins > _SPIN + 100_000:
                    time.sleep(0.001)

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
        rec[RING_WORDS - 1] = seq
        rec[0] = seq
        if self._wake is not None:
            self._wake(self._at, FUTEX_WAKE, 1, None, None, 0)

    def ring_empty(self, seq: int) -> None:
        """A null window's ring: the same record, naming memory of the harness's own, so the parent's
        work per ring (read the record, read a few positions) is what it is for a call."""
        rec = self.record
        rec[2], rec[3] = ctypes.addressof(self.dummy), _DUMMY_BYTES
        rec[1] = 1
        rec[RING_WORDS - 1] = seq
        rec[0] = seq
        if self._wake is not None:
            self._wake(self._at, FUTEX_WAKE, 1, None, None, 0)
