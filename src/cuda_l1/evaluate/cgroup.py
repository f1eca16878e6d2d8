"""A cgroup (v2) per side, where the machine offers one: stopping it is atomic, and nothing leaves it.

Stopping a process tree with SIGSTOP has a race: a fork in flight while the tree is listed links its
child only at the end, after the listing, and that child runs on unseen. The cgroup freezer has none:
`cgroup.freeze` stops every task of the group, including tasks forked while it freezes, and the
kernel says when all are stopped (`cgroup.events`). The group also lists every process (however they
were started or re-parented), counts their CPU time (`cpu.stat`) and kills them all at once
(`cgroup.kill`). A side joins its group as the first thing it does, before it forks or runs any other
code; once confined it cannot leave (Landlock allows it no write to the cgroup filesystem, and an
unprivileged uid could not write there anyway). Without a writable cgroup v2 hierarchy the evaluator
falls back to SIGSTOP (sandbox.py) and says so in the verdict's `sandbox`.
"""

from __future__ import annotations

import os
import secrets
import time

from cuda_l1.evaluate.sigstop import poll_until


def _v2_mount() -> str | None:
    try:
        with open("/proc/self/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 2 and parts[2] == "cgroup2":
                    return parts[1]
    except OSError:
        pass
    return None


def _own_path() -> str:
    try:
        with open("/proc/self/cgroup") as fh:
            for line in fh:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return "/"


def _sweep(parent: str, older_than_s: float = 600.0) -> None:
    """Remove empty groups left by evaluators that were killed (rmdir refuses a group with processes)."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith("cuda-l1-")]
    except OSError:
        return
    now = time.time()
    for name in names:
        path = os.path.join(parent, name)
        try:
            if now - os.stat(path).st_mtime > older_than_s:
                os.rmdir(path)
        except OSError:
            pass


class SideGroup:
    """One side's cgroup."""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def create(cls) -> "SideGroup | None":
        mount = _v2_mount()
        if mount is None:
            return None
        parent = os.path.join(mount, _own_path().lstrip("/"))
        _sweep(parent)
        try:  # memory accounting where the hierarchy offers it (tmpfs and memfd pages are charged too)
            with open(os.path.join(parent, "cgroup.subtree_control"), "w") as fh:
                fh.write("+memory")
        except OSError:
            pass
        path = os.path.join(parent, f"cuda-l1-{secrets.token_hex(6)}")
        try:
            os.mkdir(path)
        except OSError:
            return None
        group = cls(path)
        if not os.path.exists(group._file("cgroup.freeze")):
            group.remove()
            return None
        return group

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _read(self, name: str) -> str:
        with open(self._file(name)) as fh:
            return fh.read()

    def _write(self, name: str, value: str) -> None:
        with open(self._file(name), "w") as fh:
            fh.write(value)

    @property
    def procs_file(self) -> str:
        """What a process writes its pid into to join."""
        return self._file("cgroup.procs")

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self._read("cgroup.procs").split()]
        except OSError:
            return []

    def frozen(self) -> bool:
        try:
            return "frozen 1" in self._read("cgroup.events")
        except OSError:
            return False

    def freeze(self, timeout: float, spin_s: float = 0.0) -> bool:
        """Stop every task of the group; True once the kernel reports all of them stopped. `spin_s`:
        how long to poll without sleeping first (sigstop.poll_until)."""
        self._write("cgroup.freeze", "1")
        return poll_until(self.frozen, timeout, spin_s)

    def thaw(self) -> None:
        self._write("cgroup.freeze", "0")

    def set_frozen(self, frozen: bool) -> None:
        """Start freezing the group, or thaw it, without waiting for the kernel to report it."""
        self._write("cgroup.freeze", "1" if frozen else "0")

    def cpu_usec(self) -> int:
        """CPU time the group's tasks used, alive and ended."""
        for line in self._read("cpu.stat").splitlines():
            if line.startswith("usage_usec"):
                return int(line.split()[1])
        return 0

    def memory_bytes(self) -> int | None:
        """Memory charged to the group (resident, tmpfs, memfd, page cache), if accounted here."""
        try:
            return int(self._read("memory.current"))
        except (OSError, ValueError):
            return None

    def owned_bytes(self) -> int | None:
        """Memory the group owns: its charge less the page cache the kernel may reclaim (side_memory)."""
        current = self.memory_bytes()
        if current is None:
            return None
        try:
            return owned_from_stat(current, self._read("memory.stat"))
        except OSError:
            return current

    def limit_memory(self, nbytes: int) -> bool:
        """Let the kernel enforce the limit (the group's processes are killed beyond it)."""
        try:
            self._write("memory.max", str(int(nbytes)))
            return True
        except OSError:
            return False

    def oom_killed(self) -> bool:
        try:
            return any(line.split()[0] == "oom_kill" and int(line.split()[1]) > 0
                       for line in self._read("memory.events").splitlines())
        except (OSError, ValueError, IndexError):
            return False

    def kill(self) -> None:
        try:
            self._write("cgroup.kill", "1")
        except OSError:
            import signal

            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def remove(self) -> None:
        """Remove the (empty) group; its last processes may take a moment to be reaped."""
        for _ in range(100):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)


def owned_from_stat(current: int, stat_text: str) -> int:
    """A cgroup's owned memory from memory.current and memory.stat: the charge less its reclaimable
    page cache (memory.stat's `file` counts tmpfs and shared memory too, as `shmem`; those are owned)."""
    values = {}
    for line in stat_text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            values[parts[0]] = int(parts[1])
    if "file" not in values:
        return current
    cache = values["file"] - values.get("shmem", 0)
    return max(0, current - cache - values.get("slab_reclaimable", 0))
