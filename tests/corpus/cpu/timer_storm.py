# reference: linear_gelu
# expect: ok
# Tries to arm timers that outlive a freeze: a timerfd, a POSIX timer, an interval timer and an
# alarm. The freezer stops a side's tasks but not its armed timers, whose expiries are interrupts
# on the core the other side is timed on next: 1500 timerfds armed at the end of each window, to
# fire one every 14 us from 12 ms on, slowed the reference's following window 2-4x and scored an
# identical candidate ok at 1.27-1.53x. Each attempt that succeeds poisons the answer, so an ok
# verdict means every one of them was refused.
import ctypes
import platform
import signal

import torch
import torch.nn as nn

_libc = ctypes.CDLL(None, use_errno=True)
_armed = []
fd = _libc.timerfd_create(1, 0)  # CLOCK_MONOTONIC
if fd >= 0:
    _armed.append("timerfd_create")
timer = ctypes.c_void_p()
if hasattr(_libc, "timer_create") and _libc.timer_create(1, None, ctypes.byref(timer)) == 0:
    _armed.append("timer_create")
try:
    signal.setitimer(signal.ITIMER_VIRTUAL, 1000.0)
    _armed.append("setitimer")
except OSError:
    pass
if platform.machine() == "x86_64" and _libc.syscall(37, 1000) >= 0:  # alarm(2): the seconds left of an earlier one
    _armed.append("alarm")
    _libc.syscall(37, 0)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        y = torch.nn.functional.gelu(self.linear(x)) * 2.0
        return y + 1.0 if _armed else y
