"""Confinement a child applies to itself before any candidate code is imported.

Layers, each reported back so the verdict says exactly what was enforced on this machine:
- `namespaces`: a new PID namespace (the harness is PID 1, so every process the candidate starts dies
  with it, and no outside process can be signalled) and a new network namespace (no network at all).
  Needs root or unprivileged user namespaces.
- `landlock`: the Linux Landlock LSM (kernel >= 5.13): writes only inside the scratch directory (and
  device nodes), reads only below an allow-list of system and Python directories, so files such as
  ~/.aws/credentials cannot be opened; TCP bind/connect denied where the ABI supports it (>= 4);
  signals and abstract sockets outside the sandbox denied where supported (ABI >= 6).
- `rlimits`: CPU time, file size, open files, core dumps, and (for CPU-only runs) address space;
  processes when not running as root (the kernel ignores RLIMIT_NPROC for root).
The parent adds what a process cannot do to itself: a scrubbed environment, wall-clock and memory
watchdogs, a process-count limit, and killing the whole process group at the end (sandbox.py).

This module must stay importable without torch: the child calls it first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import struct
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_LANDLOCK_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1

# Landlock filesystem access rights (by ABI version).
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE

_libc = None


def _lib():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return _libc


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


# -- namespaces ------------------------------------------------------------------------------------
NAMESPACE_SETS = ("pid+net", "net", "pid")  # tried in this order when a GPU driver refuses one


def enter_namespaces(which: str = "pid+net") -> tuple[bool, str]:
    """unshare() new namespaces ("pid+net", "net" or "pid"). After a new PID namespace the caller must
    fork: its child becomes PID 1."""
    if not sys.platform.startswith("linux"):
        return False, "not Linux"
    flags = (CLONE_NEWPID if "pid" in which else 0) | (CLONE_NEWNET if "net" in which else 0)
    if not flags:
        return False, "none requested"
    if os.geteuid() != 0:
        flags |= CLONE_NEWUSER
    if _lib().unshare(flags) != 0:
        return False, f"unshare failed: {_errno_text()}"
    return True, which + ("+user" if flags & CLONE_NEWUSER else "")


def _probe(which: str, device: str) -> None:
    """Exit 0 if these namespaces can be entered and, for a GPU, the device initialises inside them
    (run in a throwaway process)."""
    ok, _ = enter_namespaces(which)
    if not ok:
        os._exit(2)
    pid = os.fork() if "pid" in which else 0
    if pid:
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else 1)
    if not device.startswith("cuda"):
        os._exit(0)  # nothing to initialise: the CPU needs no driver
    try:
        import torch

        torch.zeros(1, device=device).add_(1).item()
    except Exception:
        os._exit(3)
    os._exit(0)


if __name__ == "__main__":  # python -m cuda_l1.evaluate.confine probe pid+net cuda:0
    if len(sys.argv) == 4 and sys.argv[1] == "probe":
        _probe(sys.argv[2], sys.argv[3])
    sys.exit(2)


def die_with_parent() -> None:
    """Ask the kernel to kill this process when the process that started it dies."""
    if sys.platform.startswith("linux"):
        _lib().prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)


# -- resource limits -------------------------------------------------------------------------------
def apply_rlimits(*, cpu_s: int, file_bytes: int, open_files: int, address_space_bytes: int | None,
                  processes: int | None) -> dict:
    applied = {}

    def setlimit(name: str, which: int, value: int) -> None:
        try:
            soft, hard = resource.getrlimit(which)
            new = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (new, new))
            applied[name] = new
        except (ValueError, OSError) as exc:
            applied[name] = f"not applied: {exc}"

    setlimit("cpu_s", resource.RLIMIT_CPU, cpu_s)
    setlimit("file_bytes", resource.RLIMIT_FSIZE, file_bytes)
    setlimit("open_files", resource.RLIMIT_NOFILE, open_files)
    setlimit("core_bytes", resource.RLIMIT_CORE, 0)
    if address_space_bytes:
        setlimit("address_space_bytes", resource.RLIMIT_AS, address_space_bytes)
    if processes and os.geteuid() != 0:
        setlimit("processes", resource.RLIMIT_NPROC, processes)
    return applied


# -- Landlock --------------------------------------------------------------------------------------
def landlock_abi() -> int:
    if not sys.platform.startswith("linux"):
        return 0
    abi = _lib().syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(abi), 0)


def _handled_fs(abi: int) -> int:
    rights = (1 << 13) - 1  # every ABI-1 right
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    return rights  # device ioctls (ABI 5) stay unhandled: the GPU driver needs them


def apply_landlock(read_paths: list[str], write_paths: list[str], *, deny_tcp: bool = True) -> tuple[bool, str]:
    """Restrict this process (and its future children) to the given hierarchies."""
    abi = landlock_abi()
    if abi < 1:
        return False, "Landlock not available on this kernel"
    handled = _handled_fs(abi)
    net = (NET_BIND_TCP | NET_CONNECT_TCP) if (deny_tcp and abi >= 4) else 0
    scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0
    if abi >= 6:
        attr = struct.pack("<QQQ", handled, net, scoped)
    elif abi >= 4:
        attr = struct.pack("<QQ", handled, net)
    else:
        attr = struct.pack("<Q", handled)
    libc = _lib()
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), 0)
    if ruleset < 0:
        return False, f"landlock_create_ruleset failed: {_errno_text()}"
    write_rights = handled  # full control below the writable roots
    added = []
    try:
        for rights, paths in ((_READ & handled, read_paths), (write_rights, write_paths)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # a path that does not exist here needs no rule
                try:
                    allowed = rights if os.path.isdir(path) else rights & _FILE_RIGHTS
                    rule = struct.pack("<Qi", allowed, fd)
                    rbuf = ctypes.create_string_buffer(rule, len(rule))
                    if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, rbuf, 0) == 0:
                        added.append(path)
                finally:
                    os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False, f"no_new_privs failed: {_errno_text()}"
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            return False, f"landlock_restrict_self failed: {_errno_text()}"
    finally:
        os.close(ruleset)
    parts = [f"abi {abi}", "fs"]
    if net:
        parts.append("tcp denied")
    if scoped:
        parts.append("signals+abstract sockets scoped")
    return True, ", ".join(parts)


_PROC_SHARED = ("cpuinfo", "meminfo", "stat", "loadavg", "uptime", "version", "filesystems", "devices", "swaps",
                "sys", "driver", "mounts", "cgroups", "zoneinfo", "vmstat", "buddyinfo", "pressure")
_ETC_SHARED = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "zoneinfo", "nsswitch.conf",
               "passwd", "group", "hosts", "host.conf", "resolv.conf", "gai.conf", "os-release", "lsb-release",
               "debian_version", "alternatives", "ssl", "ca-certificates", "ca-certificates.conf", "mime.types",
               "machine-id", "nvidia", "OpenCL", "glvnd", "fonts", "matplotlibrc", "xdg", "profile.d", "python3",
               "pki", "crypto-policies")


def default_read_paths(extra: list[str]) -> list[str]:
    """System and Python directories a child needs to read and execute, and nothing under home dirs
    except the interpreter's own prefix and package directories."""
    import site
    import sysconfig

    paths = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt", "/sys", "/dev",
             sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    # /proc: this process's own entries and system-wide information only. Other processes' entries
    # (their environ, cmdline, memory) stay closed: the evaluator's own environment may hold keys.
    paths += ["/proc/self", "/proc/thread-self"] + [f"/proc/{name}" for name in _PROC_SHARED]
    # /etc: what the loader, libc and Python need, not shadow files, ssh keys or service credentials.
    paths += [f"/etc/{name}" for name in _ETC_SHARED]
    for key in ("stdlib", "platstdlib", "purelib", "platlib", "include", "scripts", "data"):
        try:
            paths.append(sysconfig.get_path(key))
        except KeyError:
            pass
    try:
        paths += site.getsitepackages()
    except AttributeError:
        pass
    paths += [p for p in sys.path if p and os.path.isdir(p)]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            paths.append(os.environ[var])
    paths += extra
    seen, out = set(), []
    for p in paths:
        if p and p not in seen:
            seen.add(p)
            out.append(os.path.realpath(p))
            if os.path.realpath(p) != p:
                out.append(p)
    return out
