# reference: relu_add
# expect: rejected
# check: runs_to_completion
# Ends every thread of its process but the one running it, before its first call: a signal handler set
# to libc's `syscall` makes a thread that takes the signal call exit(2) on itself alone. On a CPU each
# call's ring stops and resumes the side's whole tree, at a cost per thread that the null windows
# measure on the reference's side, which keeps its threads: with one thread fewer, and the same
# forward, identical code read raw 1.07-1.16 on 47 us LayerNorm calls (a loaded 2-core host). It keeps
# the side's thread count by forking a process that stops itself (counted, but almost free to stop:
# against a floor on the count, this form was ok). The threads its harness started may not end
# (SideProcess.watch, by thread id): rejected.
import ctypes
import os
import signal
import threading

import torch
import torch.nn as nn

_SYS_TGKILL, _SIGNAL = 234, 60  # x86-64: signal 60 is also exit's syscall number, the handler's argument


def _stopped_process() -> int:
    pid = os.fork()
    if pid == 0:
        while True:
            os.kill(os.getpid(), signal.SIGSTOP)
    return pid


def _end_other_threads() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(_SIGNAL, ctypes.cast(libc.syscall, ctypes.c_void_p).value)  # handler(sig) = syscall(60): exit
    me, ended = threading.get_native_id(), 0
    for name in os.listdir("/proc/self/task"):
        if int(name) != me and libc.syscall(_SYS_TGKILL, os.getpid(), int(name), _SIGNAL) == 0:
            ended += 1
    return ended


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ended = None

    def forward(self, x, y):
        if self.ended is None:
            self.ended = (_stopped_process(), _end_other_threads())
        return torch.relu(x) + y
