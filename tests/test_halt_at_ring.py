"""A side stopped at a ring is stopped before the parent writes its next inputs, even from inside a
long system call (gating.halt): a signal or the cgroup freezer stops a task only on its way back to
user space, so a read of the input buffer's file made right after a ring ran on through the copy
of the next slot when the stop was not waited for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cuda_l1.evaluate import gating, sigstop
from cuda_l1.evaluate.cgroup import SideGroup

READ_BYTES = 512 << 20  # one pread of a memfd this large takes 60-300 ms

# Fills a memfd, says so, then reads it whole in ONE system call, again and again.
READER = f"""
import os, sys
fd = os.memfd_create("halt-test")
os.ftruncate(fd, {READ_BYTES})
os.pwrite(fd, b"x" * (1 << 20), {READ_BYTES} - (1 << 20))
buf = bytearray({READ_BYTES})
view = memoryview(buf)
os.preadv(fd, [view], 0)  # pages touched once: later reads are copies only
sys.stdout.write("ready\\n"); sys.stdout.flush()
while True:
    os.preadv(fd, [view], 0)
"""


def _one_read_s() -> float:
    fd = os.memfd_create("halt-test-timing")
    try:
        os.ftruncate(fd, READ_BYTES)
        buf = bytearray(READ_BYTES)
        os.preadv(fd, [memoryview(buf)], 0)
        start = time.perf_counter()
        os.preadv(fd, [memoryview(buf)], 0)
        return time.perf_counter() - start
    finally:
        os.close(fd)


def _start_reader(group: SideGroup | None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", READER], stdout=subprocess.PIPE, text=True)
    try:
        if group is not None:
            with open(group.procs_file, "w") as fh:
                fh.write(str(proc.pid))
        assert proc.stdout.readline().strip() == "ready"
    except BaseException:  # never left reading in a loop behind the test
        proc.kill()
        proc.wait()
        raise
    time.sleep(0.05)  # well into its loop of long reads
    return proc


def _stopped(pid: int) -> bool:
    return all(sigstop._task_state(pid, task) in "TtZX" for task in os.listdir(f"/proc/{pid}/task"))


@pytest.mark.parametrize("how", ["cgroup", "signals"])
def test_a_side_inside_a_long_system_call_is_stopped_when_halt_returns(how):
    group = SideGroup.create() if how == "cgroup" else None
    if how == "cgroup" and group is None:
        pytest.skip("no cgroup v2 subtree to create a group in (the signals case covers the other path)")
    if _one_read_s() < 0.02:
        pytest.skip("a 512 MiB read returns too fast here to be caught inside it")
    proc = _start_reader(group)
    try:
        stopped_in = []
        for _ in range(5):  # a stop that lands between two reads is quick: several tries, all must hold
            start = time.perf_counter()
            assert gating.halt(group, [proc.pid], timeout_s=5.0)
            stopped_in.append(time.perf_counter() - start)
            # What the parent may rely on when halt returns: no task of the side is running.
            assert group.frozen() if group is not None else _stopped(proc.pid)
            if group is not None:
                group.set_frozen(False)
            else:
                os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.03)
        # Inside a read when stopped, at least once: halt waited for it to end (a stop not waited for
        # returned in microseconds, with the read still copying).
        assert max(stopped_in) > 0.005, stopped_in
    finally:
        proc.kill()
        proc.wait()
        if group is not None:
            group.remove()
