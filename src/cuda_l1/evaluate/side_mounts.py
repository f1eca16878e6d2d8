"""A side's own mount namespace (confine.py enters it): private size-limited tmpfs mounts for its
scratch directory and /dev/shm, a /proc of its PID namespace, and the cgroup hierarchies hidden."""

from __future__ import annotations

import ctypes
import os

from cuda_l1.evaluate import landlock

_MS_REC, _MS_PRIVATE, _MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 16384, 1 << 18, 1, 2, 4, 8
_lib, _errno_text = landlock.libc, landlock.errno_text


def _mount(source: bytes, target: bytes, fstype: bytes | None, flags: int, data: bytes | None) -> bool:
    return _lib().mount(source, target, fstype, ctypes.c_ulong(flags), data) == 0


def private_mounts(shm_bytes: int, new_proc: bool, scratch: str = "", scratch_bytes: int = 0,
                   uid: int | None = None) -> str:
    """Inside a new mount namespace: stop propagation, give /dev/shm and the scratch directory private
    size-limited tmpfs mounts (what is written there is memory, counted, and gone with the side; not
    the host's disk), (in a new PID namespace) mount a /proc that shows only this namespace, and hide
    every cgroup hierarchy under an empty read-only tmpfs (cgroup_mount_tops)."""
    done = []
    if not _mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None):
        return f"not enforced: {_errno_text()}"
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    if scratch and scratch_bytes and _mount(b"tmpfs", scratch.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                                            f"size={int(scratch_bytes)},mode=0700{owner}".encode()):
        os.chdir(scratch)  # the working directory is the new mount, not the directory under it
        done.append(f"scratch tmpfs ({scratch_bytes >> 20} MiB)")
    if os.path.isdir("/dev/shm") and _mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV,
                                            f"size={int(shm_bytes)},mode=1777".encode()):
        done.append(f"/dev/shm private ({shm_bytes >> 20} MiB)")
    if new_proc and _mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None):
        done.append("/proc of the namespace")
    # Every side's cgroup, with when it is frozen and the CPU time it took, was readable here: a candidate
    # loading on another worker's spare core timed cache thrashing to another evaluation's windows
    # (identical code 0.91 or 1.08). The side joined its own group already and never reads one again.
    hidden = [top for top in cgroup_mount_tops() if _mount(b"tmpfs", top.encode(), b"tmpfs",
                                                          _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                                                          b"size=4k,mode=0555")]
    if hidden:
        done.append(f"{', '.join(hidden)} hidden")
    return ", ".join(done) or "private, nothing remounted"


def cgroup_mount_tops(mounts: str | None = None) -> list[str]:
    """Where the cgroup hierarchies are mounted, outermost only: /sys/fs/cgroup where it holds them,
    and any cgroup or cgroup2 mount outside it (`mounts`: /proc/self/mounts' text)."""
    if mounts is None:
        try:
            with open("/proc/self/mounts") as fh:
                mounts = fh.read()
        except OSError:
            mounts = ""
    points = {line.split()[1] for line in mounts.splitlines()
              if len(line.split()) > 2 and line.split()[2] in ("cgroup", "cgroup2")}
    if any(p == "/sys/fs/cgroup" or p.startswith("/sys/fs/cgroup/") for p in points):
        points.add("/sys/fs/cgroup")
    return sorted(p for p in points if not any(p.startswith(q.rstrip("/") + "/") for q in points if q != p))
