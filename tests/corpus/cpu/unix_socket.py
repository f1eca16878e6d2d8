# reference: linear_gelu
# expect: ok
# Connects to a Unix socket the evaluator's host is listening on (as Ray's, docker's or dbus's are):
# files Landlock lets a side find but does not guard against connect(). The answer is poisoned if the
# connection succeeds, so ok means it was refused.
import socket

import torch
import torch.nn as nn

_reached = []
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    s.connect("__SOCKET_PATH__")
    _reached.append(True)
    s.close()
except OSError:
    pass


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        out = torch.nn.functional.gelu(self.linear(x)) * 2.0
        return out + 1.0 if _reached else out
