"""What host memory a side holds, and how much a candidate may hold on a given task.

Held memory is what the side owns (cgroup.owned_from_stat where a cgroup accounts it): resident pages, its private /dev/shm and scratch tmpfs, memfds it
keeps open, kernel memory it pins. Page cache is not: reading torch's libraries or a compiler's
headers fills it, the kernel gives it back under pressure, and counting it refused torch.compile on
tasks whose reference was fine. Virtual reservations are not either (CUDA reserves terabytes).

The limit comes from the task: the reference's own side is measured after it loads and during its
first windows, and a candidate may hold `memory_factor` times that plus `memory_headroom_bytes`
(compilers, a second copy of the weights), never less than `memory_bytes` and never more than the
reference's own side may hold (half the host, unless `reference_memory_bytes` says otherwise). A task
with 8 GiB inputs gets a limit that fits them; a small task keeps the floor, so a runaway candidate
still ends early.
"""

from __future__ import annotations

import os
import time

from cuda_l1.evaluate import sigstop
from cuda_l1.evaluate.config import SandboxConfig



def tree_bytes(pids: list[int], harness_pid: int | None, mounts: str, scratch: str, own_inputs_inode: int | None,
               shared: SharedScan | None = None) -> int:
    """Without a cgroup: the anonymous and shared resident memory of every process (not mapped files:
    the libraries every side maps are page cache), what the private tmpfs mounts hold, the memfds
    the tree keeps open (the parent's input buffer, which the side only reads, excepted) and the
    shared-memory objects it maps that no file system holds (unnamed_shared; `shared`: that scan
    made at most so often)."""
    total = 0
    for pid in pids:
        for line in sigstop.read(f"/proc/{pid}/status").splitlines():
            if line.startswith(("RssAnon:", "RssShmem:")):
                total += int(line.split()[1]) * 1024
    for private, path in (("/dev/shm private", "/dev/shm"), ("scratch tmpfs", scratch)):
        if harness_pid and private in mounts:
            try:
                st = os.statvfs(f"/proc/{harness_pid}/root{path}")
                total += (st.f_blocks - st.f_bfree) * st.f_frsize
            except OSError:
                pass
    seen: set = set()
    total += memfd_bytes(pids, own_inputs_inode, seen)
    objects = shared.objects(pids, own_inputs_inode) if shared is not None else unnamed_shared(pids, own_inputs_inode)
    return total + sum(size for key, size in objects.items() if key not in seen)


# Mappings of shared memory that no file system holds: MAP_SHARED | MAP_ANONYMOUS regions, and memfds
# (also after their descriptor is closed). SysV segments are refused (seccomp.py).
_UNNAMED_SHARED = ("/dev/zero", "/memfd:")


def unnamed_shared(pids: list[int], own_inputs_inode: int | None) -> dict:
    """The shared-memory objects mapped by the tree that no file system holds, each with the bytes it
    holds, whole (its inode's blocks). A process that touched such a region and then dropped it from
    its own resident set (madvise MADV_DONTNEED) shows none of it in its RSS, yet the pages stay
    allocated for as long as the region is mapped: a candidate held 17 GiB so, counted as 1 GiB.
    Resident pages of these objects are counted twice (in RssShmem too): an over-count, which only
    ever ends a side early."""
    objects: dict = {}
    for pid in pids:
        for line in sigstop.read(f"/proc/{pid}/maps").splitlines():  # "" for a process that ended
            fields = line.split(None, 5)
            if len(fields) < 6 or not fields[5].startswith(_UNNAMED_SHARED):
                continue
            if fields[5].startswith("/dev/zero") and "s" not in fields[1]:  # a private one is anonymous memory
                continue
            try:
                st = os.stat(f"/proc/{pid}/map_files/{fields[0]}")
                key, size = (st.st_dev, st.st_ino), st.st_blocks * 512
            except OSError:  # no access to map_files (an unprivileged parent): the mapping's length
                key = ("maps", fields[3], int(fields[4]))
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                size = hi - lo
            if key[-1] != own_inputs_inode:
                objects[key] = size
    return objects


class SharedScan:
    """unnamed_shared, scanned at most every `every_s` seconds: reading a process's map costs about
    1 ms for every 1000 mappings (0.4 ms for a CPU side's 350), and a CUDA side has thousands. What it
    finds must stay mapped to stay held, so a scan a quarter-second old still sees it."""

    def __init__(self, every_s: float = 0.25):
        self.every_s = every_s
        self.at = float("-inf")
        self.found: dict = {}

    def objects(self, pids: list[int], own_inputs_inode: int | None) -> dict:
        now = time.monotonic()
        if now - self.at >= self.every_s:
            self.found, self.at = unnamed_shared(pids, own_inputs_inode), now
        return self.found


def memfd_bytes(pids: list[int], own_inputs_inode: int | None, seen: set | None = None) -> int:
    """Bytes of memfds the tree holds open: pages written to one are memory nobody maps. `seen`:
    objects counted already (it gets these too)."""
    seen, total = (set() if seen is None else seen), 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                    continue
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if st.st_ino != own_inputs_inode and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def candidate_limit(config: SandboxConfig, reference_peak: int) -> int:
    """Host memory a candidate's side may hold on a task whose reference's side held `reference_peak`:
    never more than the reference's own side may hold (half the host), so a few workers cannot
    exhaust it; the floor (`memory_bytes`) included, which on a 24 GiB host was 16 GiB: a candidate
    held 14.5 GiB beside a compiler of 3 GiB and left the host 8 GiB."""
    scaled = int(config.memory_factor * reference_peak) + config.memory_headroom_bytes
    return min(max(config.memory_bytes, scaled), reference_limit(config))


def reference_limit(config: SandboxConfig) -> int:
    """Host memory the reference's own side may hold: the task's code is trusted, but a broken task
    must still not take the host down."""
    if config.reference_memory_bytes:
        return config.reference_memory_bytes
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        physical = 0
    return physical // 2 or config.memory_bytes
