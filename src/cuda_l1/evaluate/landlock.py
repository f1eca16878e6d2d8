"""Landlock: the filesystem (and TCP, signal and abstract-socket) rules a side confines itself to.

Reads only below an allow-list of system and Python directories (so files such as ~/.aws/credentials
cannot be opened), writes only inside the scratch directory and a few device nodes, TCP bind/connect
denied where the ABI supports it (>= 4), signals and abstract sockets outside the sandbox denied where
supported (>= 6). Rules apply to the calling thread and everything it starts later, so confine.py
applies them before any thread exists. Importable without torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import struct
import sys

_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

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


def libc():
    """The C library, with errno kept (the system calls confinement needs have no Python wrappers)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return _libc


def errno_text() -> str:
    return os.strerror(ctypes.get_errno())


# -- Landlock --------------------------------------------------------------------------------------
def landlock_abi() -> int:
    if not sys.platform.startswith("linux"):
        return 0
    abi = libc().syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(abi), 0)


def _handled_fs(abi: int) -> int:
    rights = (1 << 13) - 1  # every ABI-1 right
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    return rights  # device ioctls (ABI 5) stay unhandled: the GPU driver needs them


def apply_landlock(read_paths: list[str], write_paths: list[str], *, deny_tcp: bool = True,
                   list_paths: list[str] = ()) -> tuple[bool, str]:
    """Restrict this process (and its future children) to the given hierarchies: read (and execute)
    below `read_paths`, anything below `write_paths`, and only list the directories below `list_paths`."""
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
    lib = libc()
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = lib.syscall(_SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), 0)
    if ruleset < 0:
        return False, f"landlock_create_ruleset failed: {errno_text()}"
    write_rights = handled  # full control below the writable roots
    added = []
    try:
        for rights, paths in ((_READ & handled, read_paths), (write_rights, write_paths),
                              (FS_READ_DIR & handled, [p for p in list_paths if os.path.isdir(p)])):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # a path that does not exist here needs no rule
                try:
                    allowed = rights if os.path.isdir(path) else rights & _FILE_RIGHTS
                    rule = struct.pack("<Qi", allowed, fd)
                    rbuf = ctypes.create_string_buffer(rule, len(rule))
                    if lib.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, rbuf, 0) == 0:
                        added.append(path)
                finally:
                    os.close(fd)
        if lib.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False, f"no_new_privs failed: {errno_text()}"
        if lib.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            return False, f"landlock_restrict_self failed: {errno_text()}"
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

    paths = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt", "/sys"] + device_nodes() + [
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
        paths += site.getsitepackages() + [site.getusersitepackages()]  # (pip install --user's too)
    except AttributeError:
        pass
    paths += import_path_parts(paths)
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


def import_path_parts(roots: list[str]) -> list[str]:
    """What a side may read of the import path's entries: an entry below `roots` (the Python prefixes,
    site-packages) whole; any other (PYTHONPATH, a .pth's directory such as a flat project's root in
    an editable install) only its packages, modules and their metadata, since such an entry is often a
    project's directory, whose other files (a `.env`, a checkout's credentials) a candidate could read
    and print into its verdict's log. Their names stay listable (import_path_dirs)."""
    whole = [os.path.realpath(r) for r in roots if r and r.startswith("/")]
    parts = []
    for entry in import_path_dirs():
        real = os.path.realpath(entry)
        if any(real == r or real.startswith(r.rstrip("/") + "/") for r in whole):
            parts.append(entry)
            continue
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        for name in names:
            path = os.path.join(entry, name)
            if name.startswith(".") or os.path.dirname(os.path.realpath(path)) != real:
                continue  # (a link out of the entry: its rule would grant the target, wherever it lies)
            if os.path.isdir(path):
                if name.endswith(_METADATA_SUFFIXES) or (name.isidentifier() and _holds_modules(path)):
                    parts.append(path)
            elif _is_module_file(name):
                parts.append(path)
    return parts


def import_path_dirs() -> list[str]:
    """The import path's directories: a side may list them (Python's import system lists each entry
    before it finds anything there), whatever it may read below them (import_path_parts)."""
    return [p for p in sys.path if p and os.path.isdir(p)]


# (no .pth: Python reads those in site directories only; a library beside the modules: libfoo.so.1)
_MODULE_FILE = re.compile(r"\.(py|pyc)$|\.so(\.\d+)*$")
_METADATA_SUFFIXES = (".dist-info", ".egg-info", ".libs", ".data")


def _is_module_file(name: str) -> bool:
    return bool(_MODULE_FILE.search(name))


def _holds_modules(path: str) -> bool:
    """A package or namespace package directory: modules in it, or packages (`__init__.py`) one level
    down. Not deeper: a `data/` directory with one module three levels down was granted whole."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(_is_module_file(n) or os.path.isfile(os.path.join(path, n, "__init__.py")) for n in names)


# Device nodes a side may open: the harmless character devices, its private /dev/shm, and the GPU's.
_DEV_PLAIN = ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random", "/dev/shm")


def device_nodes() -> list[str]:
    return list(_DEV_PLAIN) + sorted(glob.glob("/dev/nvidia*"))


def default_write_paths(scratch: str) -> list[str]:
    """The scratch directory, the private /dev/shm, the device nodes (opened read-write to be used),
    and the process's own /proc entries: the CUDA driver fails to initialise (error 304) when it may
    not write below /proc/self (measured on an H200, driver 580). A process's own entries are its own."""
    return [scratch] + device_nodes() + ["/proc/self", "/proc/thread-self"]
