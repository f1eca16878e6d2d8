"""A seccomp filter that refuses what a side must not do to the measurement or to other processes.

Refused (EPERM): changing its scheduling class, priority or CPU affinity, or its core scheduling
(prctl PR_SCHED_CORE, which could keep an SMT sibling idle) (any of which would let it outrun
the other side or escape the core it is timed on), asking for transparent huge pages (madvise
MADV_HUGEPAGE or MADV_COLLAPSE: faster memory than the other side's, where the host gives them
only on request), sockets other than IP ones (the host's Unix sockets
are files, which Landlock's rules do not cover for connect(); vsock is not namespaced: it reaches a
virtual machine's host; socketpair too, unless Unix sockets are allowed: buffers queued on them are
kernel memory, which the count of a side's memory does not see), SysV IPC and
POSIX message queues, ptrace and cross-process memory access, new
namespaces (clone with CLONE_NEW*, unshare, setns), mounts, kernel keyrings, BPF, perf events,
userfaultfd, io_uring (whose operations bypass seccomp), module loading, kexec, reboot, swap, and
timers that outlive a freeze (timerfd, POSIX timers, interval timers, alarm): the freezer stops a
side's tasks, not its armed timers, whose expiries are taken as interrupts on the core the side
shared with the other one; 1500 timers armed at the end of a window to fire 12-33 ms later, one
every 14 us, slowed the other side's next window 2-4x (the one after an identical candidate's: ok at
1.27-1.53x). A thread asleep with a timeout holds one timer at most, cancelled when it is frozen.
clone3 answers ENOSYS so that the C library falls back to clone, whose flags a filter can read.
System calls of another ABI (32-bit on x86-64, x32) are refused as a whole.

Applied to every thread of the process at once (SECCOMP_FILTER_FLAG_TSYNC) before any side code runs;
inherited by every thread and process started later. Linux on x86-64 and aarch64 only; elsewhere the
layer is reported as not enforced.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

_DENIED = {
    "x86_64": {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "sched_setparam": 142,
               "sched_setscheduler": 144, "sched_setaffinity": 203, "sched_setattr": 314, "setpriority": 141,
               "perf_event_open": 298, "bpf": 321, "mount": 165, "umount2": 166, "unshare": 272, "setns": 308,
               "pivot_root": 155, "chroot": 161, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
               "finit_module": 313, "delete_module": 176, "keyctl": 250, "add_key": 248, "request_key": 249,
               "userfaultfd": 323, "ioprio_set": 251, "iopl": 172, "ioperm": 173, "swapon": 167, "swapoff": 168,
               "reboot": 169, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
               "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsmount": 432, "process_madvise": 440,
               "shmget": 29, "msgget": 68, "semget": 64, "mq_open": 240,
               "alarm": 37, "setitimer": 38, "timer_create": 222, "timer_settime": 223, "timerfd_create": 283,
               "timerfd_settime": 286},
    "aarch64": {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "sched_setparam": 118,
                "sched_setscheduler": 119, "sched_setaffinity": 122, "sched_setattr": 274, "setpriority": 140,
                "perf_event_open": 241, "bpf": 280, "mount": 40, "umount2": 39, "unshare": 97, "setns": 268,
                "pivot_root": 41, "chroot": 51, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
                "finit_module": 273, "delete_module": 106, "keyctl": 219, "add_key": 217, "request_key": 218,
                "userfaultfd": 282, "ioprio_set": 30, "swapon": 224, "swapoff": 225, "reboot": 142,
                "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
                "move_mount": 429, "fsopen": 430, "fsmount": 432, "process_madvise": 440,
                "shmget": 194, "msgget": 186, "semget": 190, "mq_open": 180,
                "setitimer": 103, "timer_create": 107, "timer_settime": 110, "timerfd_create": 85,
                "timerfd_settime": 86},
}
_CLONE = {"x86_64": 56, "aarch64": 220}
_SOCKET = {"x86_64": 41, "aarch64": 198}
_SOCKETPAIR = {"x86_64": 53, "aarch64": 199}
_PRCTL = {"x86_64": 157, "aarch64": 167}
_PR_SCHED_CORE = 62  # core scheduling: a side could keep its core's SMT sibling idle during its windows
_MADVISE = {"x86_64": 28, "aarch64": 233}
# Huge pages asked for by one side only (where the host's THP mode is "madvise", a region gets them only
# if asked): fewer page faults and TLB misses than the other side's same code has.
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25
_AF_UNIX, _AF_INET, _AF_INET6 = 1, 2, 10
# What socket() may create, strongest first. A GPU driver may need Unix sockets (CUDA's IPC passes
# descriptors over them); no driver needs vsock, netlink or packet sockets, so "any" is only the
# last resort of a machine on which nothing narrower lets the device start (probe.py reports it).
SOCKET_LEVELS = ("ip", "ip+unix", "any")
_SOCKET_FAMILIES = {"ip": (_AF_INET, _AF_INET6), "ip+unix": (_AF_INET, _AF_INET6, _AF_UNIX), "any": ()}
_CLONE3 = 435
_SECCOMP_SYSCALL = {"x86_64": 317, "aarch64": 277}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080

_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(arch: str, sockets: str = "ip") -> bytes:
    """The BPF program for `arch`, as the kernel's array of struct sock_filter; `sockets` is one of
    SOCKET_LEVELS: the families socket() may create."""
    if sockets not in _SOCKET_FAMILIES:
        raise ValueError(f"sockets must be one of {SOCKET_LEVELS}, not {sockets!r}")
    deny = _ERRNO | errno.EPERM
    prog = [_ins(_LD_ABS_W, 4),  # seccomp_data.arch
            _ins(_JEQ, _AUDIT_ARCH[arch], 1, 0),
            _ins(_RET, deny),
            _ins(_LD_ABS_W, 0)]  # seccomp_data.nr
    if arch == "x86_64":
        prog += [_ins(_JGE, 0x40000000, 0, 1), _ins(_RET, deny)]  # the x32 ABI
    for nr in sorted(_DENIED[arch].values()):
        prog += [_ins(_JEQ, nr, 0, 1), _ins(_RET, deny)]
    families = _SOCKET_FAMILIES[sockets]
    if families:  # socket() of these families only, inert in the empty network namespace
        n = len(families)
        prog += [_ins(_JEQ, _SOCKET[arch], 0, n + 3), _ins(_LD_ABS_W, 16)]  # args[0]: the family
        prog += [_ins(_JEQ, family, n - i, 0) for i, family in enumerate(families)]
        prog += [_ins(_RET, deny), _ins(_LD_ABS_W, 0)]
    if families and _AF_UNIX not in families:
        # socketpair() makes Unix sockets only. Their queued bytes are kernel memory, which no count
        # of a side's memory sees where no cgroup accounts it: 327 pairs held 5 GiB counted as 0.5.
        prog += [_ins(_JEQ, _SOCKETPAIR[arch], 0, 1), _ins(_RET, deny)]
    prog += [_ins(_JEQ, _PRCTL[arch], 0, 4), _ins(_LD_ABS_W, 16),  # prctl's option
             _ins(_JEQ, _PR_SCHED_CORE, 0, 1), _ins(_RET, deny), _ins(_LD_ABS_W, 0)]
    prog += [_ins(_JEQ, _MADVISE[arch], 0, 5), _ins(_LD_ABS_W, 32),  # madvise's advice (args[2])
             _ins(_JEQ, _MADV_HUGEPAGE, 1, 0), _ins(_JEQ, _MADV_COLLAPSE, 0, 1), _ins(_RET, deny),
             _ins(_LD_ABS_W, 0)]
    prog += [_ins(_JEQ, _CLONE3, 0, 1), _ins(_RET, _ERRNO | errno.ENOSYS),
             _ins(_JEQ, _CLONE[arch], 0, 3),
             _ins(_LD_ABS_W, 16),  # args[0], low 32 bits on a little-endian machine: the clone flags
             _ins(_JSET, _CLONE_NEW, 0, 1),
             _ins(_RET, deny),
             _ins(_RET, _ALLOW)]
    return b"".join(prog)


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def apply_filter(sockets: str = "ip") -> tuple[bool, str]:
    """Install the filter on every thread of this process. (ok, note for the sandbox report)."""
    arch = platform.machine()
    if not os.uname().sysname == "Linux" or arch not in _DENIED:
        return False, f"not available on {os.uname().sysname}/{arch}"
    code = build_filter(arch, sockets)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return False, f"no_new_privs failed: {os.strerror(ctypes.get_errno())}"
    SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(_SECCOMP_SYSCALL[arch]), ctypes.c_long(SECCOMP_SET_MODE_FILTER),
                      ctypes.c_long(SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if rc != 0:
        return False, f"seccomp failed: {os.strerror(ctypes.get_errno()) if rc < 0 else f'thread {rc} could not sync'}"
    refused = {"ip": ", non-IP sockets", "ip+unix": ", sockets other than IP and Unix", "any": ""}[sockets]
    allowed = "; all socket families allowed (the device needed them)" if sockets == "any" else ""
    return True, (f"{len(_DENIED[arch]) + 2} system calls refused (scheduling, affinity, timers, ptrace, namespaces"
                  f"{refused}, ...){allowed}")
