# reference: linear_gelu
# expect: ok
# Reaches for what namespaces and Landlock do not cover by themselves: a SysV shared-memory segment
# (outlives the evaluation, shared with later candidates, not counted once detached), a POSIX message
# queue, and a vsock socket (not network-namespaced: it reaches a virtual machine's host). Any attempt
# that succeeds poisons the answer, so ok means all were refused.
import ctypes
import socket

import torch
import torch.nn as nn

_escaped = []
libc = ctypes.CDLL(None, use_errno=True)
if libc.shmget(0x6C314B32, 1 << 20, 0o1666) >= 0:
    _escaped.append("shmget")
if libc.msgget(0x6C314B33, 0o1666) >= 0:
    _escaped.append("msgget")
for family in ("AF_VSOCK", "AF_NETLINK", "AF_PACKET"):
    try:
        socket.socket(getattr(socket, family), socket.SOCK_DGRAM).close()
        _escaped.append(family)
    except (OSError, AttributeError):
        pass


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        out = torch.nn.functional.gelu(self.linear(x)) * 2.0
        return out + 1.0 if _escaped else out
