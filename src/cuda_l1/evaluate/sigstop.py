"""Stopping a process tree without a cgroup: SIGSTOP to every process, and the checks behind it.

The fallback where no cgroup v2 can be made (cgroup.py), and how a side still starting is stopped
before it joins its cgroup. A fork in flight when its parent is signalled completes before the
parent stops, and its child is linked only then: the tree is listed again once all of it is
stopped, until a listing finds nothing new. What no listing sees, a child that ran and exited in
between, two checks catch: the tree must not have grown, nor used CPU time, while stopped; and, in
a PID namespace with its own /proc, the namespace's last pid must not have moved (a child that ran
and exited before the check still took a pid).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def stat_fields(pid: int) -> list[str]:
    text = read(f"/proc/{pid}/stat")
    return text[text.rindex(")") + 2:].split() if ")" in text else []


def _task_state(pid: int, task: str) -> str:
    text = read(f"/proc/{pid}/task/{task}/stat")
    return text[text.rindex(")") + 2] if ")" in text else "X"


def children(pid: int, task: int | str | None = None) -> list[int]:
    """The children of one thread of `pid` (its main thread by default), as the kernel lists them."""
    return [int(c) for c in read(f"/proc/{pid}/task/{pid if task is None else task}/children").split()]


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants, as the kernel lists them: children of every thread, recursively."""
    out, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        out.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            frontier += children(pid, task)
    return out


def thread_count(pids: list[int]) -> int:
    """Threads of these processes, all together (the kernel's num_threads of each)."""
    total = 0
    for pid in pids:
        f = stat_fields(pid)
        if len(f) > 17:
            total += int(f[17])
    return total


def thread_ids(pids: list[int]) -> set[tuple[int, str]]:
    """Every thread of these processes, as (process, thread id)."""
    out = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            out.update((pid, task) for task in os.listdir(f"/proc/{pid}/task"))
    return out


def ended_threads(threads) -> list[tuple[int, str]]:
    """Those of `threads` (thread_ids) that ended: gone, or a zombie (a main thread that exited alone).
    Thread ids are not reused while their process lives, so one ended cannot come back under its id."""
    return [(pid, task) for pid, task in threads if _task_state(pid, task) in "ZXx"]


def cpu_ticks(pids: list[int]) -> int:
    """User + system CPU time of these processes, in clock ticks (ended threads included)."""
    total = 0
    for pid in pids:
        f = stat_fields(pid)
        if len(f) > 14:
            total += int(f[11]) + int(f[12])
    return total


def stop_tree(root: int, stopped: set[int], timeout: float) -> bool:
    """SIGSTOP every process of the tree (adding them to `stopped`) and wait until each of their
    threads is stopped; False if one would not stop in time. The tree is listed again once all of
    it is stopped: a fork in flight when its parent got the signal completes before the parent
    stops, so its child shows up only then (a side still starting forks its namespace's init so:
    listed before, that child ran on through the freeze), and is stopped in its turn. A stopped
    tree cannot grow, so a listing that finds nothing new after the wait is complete."""
    deadline = time.monotonic() + timeout
    for _ in range(50):
        new = [p for p in process_tree(root) if p not in stopped]
        if not new:
            return True
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        stopped.update(new)
        for pid in new:
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue  # gone already
            for task in tasks:
                while _task_state(pid, task) not in "TtZX":
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.00002)
    return False  # still growing after 50 passes: not a tree that can be stopped


def poll_until(done, timeout: float, spin_s: float = 0.0) -> bool:
    """Whether `done()` came true within `timeout`: polled without sleeping for `spin_s`, then every 20 us
    (a sleep that lasts 60-80 us on a loaded host, so not while the answer is microseconds away)."""
    start = time.monotonic()
    deadline, spin_until = start + timeout, start + spin_s
    while not done():
        now = time.monotonic()
        if now > deadline:
            return False
        if now > spin_until:
            time.sleep(0.00002)
    return True


def wait_stopped(pids: list[int], timeout: float, spin_s: float = 0.0) -> bool:
    """Whether every thread of these processes is stopped (or gone) within `timeout`, polled without
    sleeping for `spin_s` first. A signal stops a thread only on its way back to user space: one inside
    a long system call (a read of a large file) runs on until it returns. A process whose threads
    cannot be listed for another reason than its end is not known to be stopped: False."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone
        except OSError:
            return False
        for task in tasks:
            if not poll_until(lambda p=pid, t=task: _task_state(p, t) in "TtZX", deadline - time.monotonic(), spin_s):
                return False
    return True


def resume(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
