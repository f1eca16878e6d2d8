"""The per-call doorbell's pieces in one process (the whole protocol runs in every CPU evaluation and
in the corpus: tests/corpus/cpu/batch_window_*.py, defer_to_last_call.py): the side's ring page as
the parent maps it, the order a parent accepts rings in, and the check after a window."""

from __future__ import annotations

import ctypes
import os
import time

import pytest
import torch

from cuda_l1.evaluate import doorbell, gating
from cuda_l1.evaluate.doorbell import RING_WORDS, SideBell, leaf_span
from cuda_l1.evaluate.gating import Gate, RingFailure, RingPage, Rung, unstable
from cuda_l1.evaluate.protocol import CallOutputs, LeafRef


class _Proc:
    """What the parent's half uses of a side's process: this process stands in for the side."""

    device = "cpu"
    killed = ""
    frozen: set = set()  # the tree as last stopped (gating.Gate stops it while answering large slots)

    def harness_pid(self):
        return os.getpid()

    def kill(self, why=""):
        self.killed = why


def _leaf(t: torch.Tensor) -> LeafRef:
    storage = t.untyped_storage()
    return LeafRef("tensor", "torch.Tensor", str(t.dtype).replace("torch.", ""), list(t.shape), list(t.stride()),
                   t.storage_offset(), storage.nbytes(), "cpu", storage.data_ptr())


def _bell() -> SideBell:
    return SideBell()


def test_a_ring_and_a_go_cross_the_shared_sealed_page():
    bell = _bell()
    page = RingPage(_Proc(), bell.fd)
    out = torch.arange(6, dtype=torch.float32)[2:]
    bell.ring(7, CallOutputs("tensor", [_leaf(out)]))
    assert page.words[0] == 7 and page.words[RING_WORDS - 1] == 7 and page.words[1] == 1
    assert (page.words[2], page.words[3]) == (out.data_ptr(), 16) == leaf_span(_leaf(out))
    page.go.value = 7
    bell.wait(7)  # returns at once: the parent's go is seen
    page.close()


def test_a_ring_page_that_can_shrink_is_refused():
    fd = os.memfd_create("not-sealed", os.MFD_CLOEXEC)
    os.ftruncate(fd, 4096)
    try:
        with pytest.raises(RingFailure):
            RingPage(_Proc(), fd)
    finally:
        os.close(fd)


def _gate(bell: SideBell, base: int = 10, rings: int = 3) -> Gate:
    gate = Gate.__new__(Gate)  # only what _rung needs
    gate.proc, gate.words, gate.base, gate.k, gate.n = _Proc(), RingPage(_Proc(), bell.fd).words, base, 0, rings
    return gate


def test_rings_are_accepted_in_order_only():
    bell = _bell()
    gate = _gate(bell)
    empty = CallOutputs("tensor", [])
    assert not gate._rung()  # nothing rung yet (a word from before the window)
    bell.ring(11, empty)
    assert gate._rung()
    gate.k = 1
    assert not gate._rung()  # call 1's ring still there while call 2 runs
    bell.ring(13, empty)  # call 3's ring where call 2's was due
    with pytest.raises(RingFailure, match="out of order"):
        gate._rung()
    assert gate.proc.killed


def test_outputs_that_changed_or_moved_after_their_ring_are_found():
    out = torch.zeros(1024)
    call = CallOutputs("tensor", [_leaf(out)])
    address, nbytes = leaf_span(call.leaves[0])
    spots = [(address + 8 * i, 8) for i in range(0, 1024 // 2, 64)]
    seen = b"".join(out.view(torch.uint8)[a - address:a - address + n].numpy().tobytes() for a, n in spots)
    rung = Rung(((address, nbytes),), 1, spots, seen)
    assert unstable([rung], [call], os.getpid()) is None
    out[64:] = 1.0  # finished after the call rang
    assert unstable([rung], [call], os.getpid())[0] == "outputs_stable"
    elsewhere = CallOutputs("tensor", [_leaf(torch.zeros(1024))])
    assert "other memory" in unstable([rung], [elsewhere], os.getpid())[1]
    assert unstable([Rung(((address, nbytes),), 1, spots, None)], [call], os.getpid())[0] == "outputs_readable"


def test_a_side_asleep_on_the_go_word_is_woken_from_another_process():
    """The side polls for 100 us and then sleeps on the go word's futex: the parent's go, written from
    another process through its own mapping of the page, must reach it there (a futex on a private
    copy-on-write mapping, where the go word first lived, broke the side's view away from the
    parent's page, and the side never saw go)."""
    from cuda_l1.evaluate.doorbell import FUTEX_WAKE, futex_call

    bell = _bell()
    page = RingPage(_Proc(), bell.fd)
    futex = futex_call()
    pid = os.fork()
    if pid == 0:  # the side: rings 1, waits for go 1 (asleep by then), rings 2
        try:
            bell.ring_empty(1)
            bell.wait(1)
            bell.ring_empty(2)
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while page.words[0] != 1 and time.monotonic() < deadline:
            time.sleep(1e-4)
        time.sleep(0.05)  # long past the side's polling: it sleeps on the futex now
        assert page.words[0] == 1
        page.go.value = 1
        if futex is not None:
            futex(page.go_at, FUTEX_WAKE, 1, None, None, 0)
        while page.words[0] != 2 and time.monotonic() < deadline:
            time.sleep(1e-4)
        assert page.words[0] == 2 and page.words[RING_WORDS - 1] == 2
    finally:
        os.waitpid(pid, 0)
        page.close()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two cores to pin to")
def test_the_parent_waits_off_every_timed_core_and_polls_only_on_a_free_one():
    allowed = sorted(os.sched_getaffinity(0))
    timed, other = allowed[0], allowed[1]
    with gating.wait_cores(timed) as polls:  # one worker: any core but the timed one
        assert polls and os.sched_getaffinity(0) == set(allowed) - {timed}
    busy = tuple(allowed[1:])  # every other core is another worker's timed core
    with gating.wait_cores(timed, busy) as polls:
        assert not polls and os.sched_getaffinity(0) == {timed}
    assert os.sched_getaffinity(0) == set(allowed)
    with gating.wait_cores(None, (other,)) as polls:  # not pinned (several threads a side): as before
        assert polls and os.sched_getaffinity(0) == set(allowed)


def test_a_ring_wakes_the_parent_only_while_it_sleeps_and_a_sleeping_parent_is_woken(monkeypatch):
    """A wake is a system call a candidate's own loop would skip while the parent polls, so the
    harness skips it too unless the parent said it sleeps; a parent asleep on the ring is still
    woken at once (not after its 20 ms nap), from another process."""
    import platform

    from cuda_l1.evaluate.doorbell import futex_call

    bell = _bell()
    page = RingPage(_Proc(), bell.fd)
    wakes = []
    real = bell._futex
    if platform.machine() == "x86_64" and real is not None:
        bell._futex = lambda *args: wakes.append(args[1]) or real(*args)
        bell.ring_empty(1)
        assert wakes == []  # the parent polls: no system call
        page.asleep.value = 1
        bell.ring_empty(2)
        assert len(wakes) == 1
        page.asleep.value = 0
        bell._futex = real
    if futex_call() is None:
        page.close()
        return

    class _Quiet(_Proc):  # a side's process with a channel that holds no frame
        chan = type("Chan", (), {"has_pending": staticmethod(lambda: False)})()

        def watch(self):
            pass

    class _Side:  # what a Gate needs of a side: its process, its buffer, its ring page and sequence
        proc, ring, next_seq = _Quiet(), page, 100
        buffer = type("Buffer", (), {"source": type("Source", (), {"slot_bytes": 4096})()})()

    # A nap of 2 s instead of 20 ms: a wake that never came then shows as 2 s, far from what a busy
    # host's scheduling adds to a real wake (up to 11 ms seen with two busy processes on two cores).
    monkeypatch.setattr(gating, "NAP", ctypes.byref(doorbell._Timespec(2, 0)))
    gate = Gate(_Side(), [0], 1, lambda slot: None, spin_s=0.0)  # never polls: sleeps on the futex at once
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the side: rings once the parent has had time to fall asleep, and says when
        try:
            time.sleep(0.2)
            rang = time.perf_counter()  # CLOCK_MONOTONIC: one clock for both processes
            bell.ring_empty(101)
            os.write(write_end, repr(rang).encode())
        finally:
            os._exit(0)
    try:
        assert gate._wait(time.monotonic() + 5) is True
        woken = time.perf_counter()
        assert page.asleep.value == 0
        rang = float(os.read(read_end, 64))
        # Woken by the ring's wake (tens of microseconds), not by its nap running out.
        assert woken - rang < 0.5, woken - rang
    finally:
        os.waitpid(pid, 0)
        os.close(read_end)
        os.close(write_end)
        page.close()
