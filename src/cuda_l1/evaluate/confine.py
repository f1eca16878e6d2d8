"""Confinement a side applies to itself at process start, before torch is imported and before any
thread exists (so every rule holds for every thread it will ever have).

In this order, each layer reported back so the verdict says what was enforced on this machine:
1. `cpu_core`: pinned to the core both sides are timed on (CPU evaluations); seccomp then forbids
   changing it.
2. `namespaces`: new PID (under an init of its own, whose exit ends everything the side started;
   no outside process can be named; the harness's pid there is unique on the host, see
   `_start_harness_under_init`), network (no network at all), mount and IPC (SysV objects die with
   the side and no host one can be reached) namespaces; a user namespace too when not started as root.
3. `mounts`: private, size-limited tmpfs mounts on /dev/shm and on the scratch directory (writes are
   memory, counted, and vanish with the side), and a /proc that shows only the namespace.
4. `rlimits`: CPU time, file size, open files, core dumps, and (CPU evaluations) address space.
5. `identity`: an unprivileged uid (65534) when the interpreter and packages are readable by one;
   otherwise uid 0 stays but every capability is dropped (bounding, ambient, effective, permitted)
   and the securebits are locked, so root's owner rights remain only where Landlock allows.
6. `landlock` (landlock.py): reads below an allow-list, writes in the scratch directory and device nodes.
7. `seccomp` (seccomp.py): no scheduling, priority or affinity changes, no ptrace, no namespaces.
0. `cgroup`: the side joins a cgroup of its own before anything else (cgroup.py), so that stopping it
   between windows is atomic and nothing it starts escapes.
The parent adds what a process cannot do to itself (sandbox.py): a scrubbed environment, freezing
between windows, memory and process watchdogs, reading outputs from outside.

This module must stay importable without torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import signal
import stat
import sys
from dataclasses import dataclass, field

from cuda_l1.evaluate import landlock, seccomp, side_mounts, sigstop

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_SYS_RESOURCE = 24
_SECUREBITS_LOCKED = 0x1 | 0x2 | 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # noroot, no_setuid_fixup, keep_caps, ambient: locked
NOBODY = 65534
NAMESPACE_SETS = ("pid+net+mnt+ipc", "pid+net+mnt", "pid+net", "net", "pid", "")  # tried in order while a device refuses one

_lib, _errno_text = landlock.libc, landlock.errno_text


@dataclass
class ConfinePlan:
    """What a side applies to itself at start; sent on its command line as JSON."""

    scratch: str  # the side's working directory, the only place it may write
    namespaces: str = "pid+net+mnt"  # a subset of pid, net, mnt joined by '+', or '' for none
    landlock: bool = True  # filesystem (and TCP, signal) rules
    seccomp: bool = True  # the system-call filter
    sockets: str = "ip"  # families seccomp lets socket() create (seccomp.SOCKET_LEVELS; widened only if a device needs it)
    drop_identity: bool = True  # unprivileged uid where possible, otherwise no capabilities
    uid: int | None = None  # the uid to take when dropping identity (None: keep uid, drop capabilities)
    cpu_core: int | None = None  # pin to this core (CPU evaluations)
    shm_bytes: int = 64 << 20  # size of the private /dev/shm
    scratch_bytes: int = 4 << 30  # size of the tmpfs the scratch directory becomes (mount namespace)
    read_paths: list[str] = field(default_factory=list)  # extra readable directories (the build cache)
    limits: dict = field(default_factory=dict)  # cpu_s, file_bytes, open_files, address_space_bytes
    cgroup_procs: str = ""  # the side's own cgroup (its cgroup.procs file): joined before anything else
    # The host's OOM killer takes a side before anything else (the evaluator, a compiler, the host's own
    # processes): it picks by resident memory, and a side can hold memory that no resident set shows
    # (a memfd written, never mapped). Written with CAP_SYS_RESOURCE in the host's user namespace, the
    # score is also the least the side may set later; elsewhere (some containers) the side could lower it.
    oom_score_adj: int = 1000


def die_with_parent() -> None:
    """Ask the kernel to kill this process when the process that started it dies."""
    if sys.platform.startswith("linux"):
        _lib().prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)


# -- namespaces ------------------------------------------------------------------------------------
def enter_namespaces(which: str) -> tuple[bool, str]:
    """unshare() the namespaces named in `which` (pid, net, mnt, ipc). After a new PID namespace the
    caller must fork: its child becomes PID 1."""
    if not sys.platform.startswith("linux"):
        return False, "not Linux"
    parts = set(filter(None, which.split("+")))
    flags = ((CLONE_NEWPID if "pid" in parts else 0) | (CLONE_NEWNET if "net" in parts else 0)
             | (CLONE_NEWNS if "mnt" in parts else 0) | (CLONE_NEWIPC if "ipc" in parts else 0))
    if not flags:
        return False, "none requested"
    uid, gid = os.geteuid(), os.getegid()
    if uid != 0:
        flags |= CLONE_NEWUSER
    if _lib().unshare(flags) != 0:
        return False, f"unshare failed: {_errno_text()}"
    if flags & CLONE_NEWUSER:  # map ourselves to ourselves: no new identity, only the namespace's rights
        try:
            for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                               ("/proc/self/gid_map", f"{gid} {gid} 1")):
                with open(path, "w") as fh:
                    fh.write(text)
        except OSError as exc:
            return False, f"user namespace mapping failed: {exc.strerror}"
    return True, which + ("+user" if flags & CLONE_NEWUSER else "")


# -- identity --------------------------------------------------------------------------------------
def readable_by_others(paths: list[str]) -> bool:
    """Every path (and every directory above it) can be read and searched by an unrelated uid."""
    for path in paths:
        path = os.path.realpath(path)
        if not os.path.exists(path):
            continue
        chain, current = [path], path
        while current != os.path.dirname(current):
            current = os.path.dirname(current)
            chain.append(current)
        for p in chain:
            mode = os.stat(p).st_mode
            need = stat.S_IXOTH if p != path or stat.S_ISDIR(mode) else 0
            need |= stat.S_IROTH if p == path else 0
            if mode & need != need:
                return False
    return True


def _drop_bounding_and_ambient() -> None:
    """What no later exec may regain: the bounding and ambient sets, and securebits locked so that
    uid 0 means nothing. Needs CAP_SETPCAP, so it comes first."""
    libc = _lib()
    if os.geteuid() == 0:
        libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS_LOCKED, 0, 0, 0)
    for cap in range(64):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability: ignored
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


def _clear_capability_sets() -> bool:
    """Effective, permitted and inheritable emptied (lowering is always allowed)."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    return _lib().capset(header, data) == 0


def _initial_user_namespace() -> bool:
    """Whether this process is in the host's own user namespace: a capability held in another one (a
    rootless container) does not make the kernel keep the OOM score as a floor."""
    try:
        with open("/proc/self/uid_map") as fh:
            return fh.read().split() == ["0", "0", "4294967295"]
    except OSError:
        return False


def effective_capabilities() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return -1


CONFINEMENT_FAILED = 5  # exit status of a side whose confinement could not be applied (child.py, init)


class ConfinementError(RuntimeError):
    """A layer the plan asks for could not be applied, and running on without it is not safe."""


def drop_identity(uid: int | None) -> str:
    """Take `uid` (when root and one is given) and end with no capabilities at all. The order
    matters: the bounding set needs CAP_SETPCAP, the uid change CAP_SETUID/CAP_SETGID, so the
    effective set is emptied last."""
    _drop_bounding_and_ambient()
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _clear_capability_sets()
    caps = effective_capabilities()
    who = f"uid {os.geteuid()}"
    return f"{who}, no capabilities" if caps == 0 else f"not enforced: {who} keeps capabilities {caps:#x}"


# -- resource limits -------------------------------------------------------------------------------
def apply_rlimits(*, cpu_s: int = 3600, file_bytes: int = 512 << 20, open_files: int = 4096,
                  address_space_bytes: int | None = None) -> dict:
    applied = {}

    def setlimit(name: str, which: int, value: int) -> None:
        try:
            soft, hard = resource.getrlimit(which)
            new = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (new, new))
            applied[name] = new
        except (ValueError, OSError) as exc:
            applied[name] = f"not applied: {exc}"

    setlimit("cpu_s", resource.RLIMIT_CPU, int(cpu_s))
    setlimit("file_bytes", resource.RLIMIT_FSIZE, int(file_bytes))
    setlimit("open_files", resource.RLIMIT_NOFILE, int(open_files))
    setlimit("core_bytes", resource.RLIMIT_CORE, 0)
    if address_space_bytes:
        setlimit("address_space_bytes", resource.RLIMIT_AS, int(address_space_bytes))
    return applied


# -- the whole sequence ----------------------------------------------------------------------------
def _exit_as(status: int) -> None:
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _wait_and_mirror(pid: int) -> None:
    """The process outside the namespaces: wait for the namespace's init and exit the way it exited."""
    _, status = os.waitpid(pid, 0)
    _exit_as(status)


def _be_init(plan: ConfinePlan, keep_fds: tuple[int, ...], harness: int) -> None:
    """The namespace's PID 1 from here on: no channel, no capabilities, deaf to every signal a
    process of the side could send, and never anything but waiting (any failure ends it, and with it
    the namespace; it never returns into the harness's code)."""
    try:
        for fd in keep_fds:
            os.close(fd)
        for sig in signal.valid_signals():
            if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
                try:
                    signal.signal(sig, signal.SIG_IGN)
                except (OSError, ValueError):
                    pass
        _lib().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        _lib().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if plan.drop_identity and drop_identity(plan.uid).startswith("not enforced"):
            os._exit(CONFINEMENT_FAILED)
        die_with_parent()  # again: the kernel clears the parent-death signal when the uid changes
        while True:  # orphans of the side are reparented here: reap them until the harness ends
            try:
                done, status = os.wait()
            except InterruptedError:
                continue
            if done == harness:
                _exit_as(status)
    except BaseException:  # noqa: BLE001 - init must never unwind into the harness's code
        os._exit(1)


def _start_harness_under_init(plan: ConfinePlan, keep_fds: tuple[int, ...], pid: int) -> str:
    """Called as PID 1 of the new namespace. The harness must not be PID 1: CUDA's IPC takes a handle
    whose exporter has the opener's own pid for one of the opener's own allocations and refuses it, so
    two sides, each PID 1 of its namespace, could not read each other's outputs. PID 1 stays a minimal
    init (reaps, exits the way the harness exits, and its exit ends everything in the namespace) and
    the harness takes `pid`, the pid of this side's outermost process, which no other live process on
    the host has, hence no other side's harness either."""
    note = f"harness is pid {pid} of its namespace, under an init of its own"
    try:
        with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
            fh.write(str(pid - 1))
    except OSError as exc:
        note = f"harness pid not chosen ({exc.strerror}): CUDA IPC between sides may be refused"
    child = os.fork()
    if child:
        _be_init(plan, keep_fds, child)
    die_with_parent()
    if os.getpid() != pid and "not chosen" not in note:
        note = f"harness pid {os.getpid()} instead of {pid}: CUDA IPC between sides may be refused"
    return note


def confine_process(plan: ConfinePlan, keep_fds: tuple[int, ...] = ()) -> dict[str, str]:
    """Apply the plan to this process; returns what was enforced (for the verdict's `sandbox`).
    With a PID namespace this forks twice: the caller continues as the harness, under the namespace's
    init (PID 1); the original process and the init wait and mirror its exit, holding none of
    `keep_fds` open."""
    notes: dict[str, str] = {}
    die_with_parent()
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write(str(plan.oom_score_adj))
        locked = effective_capabilities() & (1 << _CAP_SYS_RESOURCE) and _initial_user_namespace()
        notes["oom_score_adj"] = f"{plan.oom_score_adj}{'' if locked else ' (not locked: no CAP_SYS_RESOURCE)'}"
    except OSError as exc:
        notes["oom_score_adj"] = f"not enforced: {exc.strerror}"
    if plan.cgroup_procs:  # first, so that every process this one ever starts is in the group too
        try:
            with open(plan.cgroup_procs, "w") as fh:
                fh.write(str(os.getpid()))
            notes["cgroup"] = "own cgroup (frozen atomically between windows)"
        except OSError as exc:
            notes["cgroup"] = f"not enforced: {exc.strerror}"
    if plan.cpu_core is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {plan.cpu_core})
            notes["cpu_core"] = str(plan.cpu_core)
        except OSError as exc:
            notes["cpu_core"] = f"not enforced: {exc.strerror}"
    which = plan.namespaces
    notes["namespaces"] = "disabled by configuration"
    if which:
        outer_pid = os.getpid()
        ok, note = enter_namespaces(which)
        notes["namespaces"] = note if ok else f"not enforced: {note}"
        if ok and "pid" in which:
            pid = os.fork()
            if pid:
                for fd in keep_fds:
                    os.close(fd)
                _wait_and_mirror(pid)
            die_with_parent()
        if ok and "mnt" in which:
            notes["mounts"] = side_mounts.private_mounts(plan.shm_bytes, "pid" in which, plan.scratch, plan.scratch_bytes, plan.uid)
        if ok and "pid" in which:
            notes["pid"] = _start_harness_under_init(plan, keep_fds, outer_pid)
    notes["rlimits"] = ", ".join(f"{k}={v}" for k, v in apply_rlimits(**plan.limits).items())
    notes["identity"] = drop_identity(plan.uid) if plan.drop_identity else "disabled by configuration"
    die_with_parent()  # again: the kernel clears the parent-death signal when the uid changes
    if notes["identity"].startswith("not enforced"):
        # Fail closed: candidate code never runs with capabilities it was meant not to have.
        raise ConfinementError(f"the side's identity could not be dropped ({notes['identity']}); "
                               "set sandbox.drop_identity = False only where the evaluator itself runs unprivileged")
    if plan.landlock:
        read = landlock.default_read_paths(list(plan.read_paths))
        ok, note = landlock.apply_landlock(read, landlock.default_write_paths(plan.scratch),
                                           list_paths=landlock.import_path_dirs())
        notes["landlock"] = note if ok else f"not enforced: {note}"
    else:
        notes["landlock"] = "disabled by configuration"
    if plan.seccomp:
        ok, note = seccomp.apply_filter(plan.sockets)
        notes["seccomp"] = note if ok else f"not enforced: {note}"
    else:
        notes["seccomp"] = "disabled by configuration"
    return notes


landlock_abi = landlock.landlock_abi  # what the kernel offers (tests and reports ask here)


def harness_under_init(outer: int) -> int | None:
    """Host pid of the harness: the child of the namespace's init whose pid there is the outer
    process's pid (_start_harness_under_init), or pid 2 where that pid could not be chosen."""
    inits = sigstop.children(outer)
    if not inits:
        return None
    found = {}
    for pid in sigstop.children(inits[0]):
        for line in sigstop.read(f"/proc/{pid}/status").splitlines():
            if line.startswith("NSpid:"):
                found[line.split()[-1]] = pid
    # Init's first child is pid 2 there when its pid could not be chosen; anything else under init
    # (an orphan of the side's) is never taken for the harness.
    return found.get(str(outer), found.get("2"))
