# reference: relu_add
# expect: ok
# Tries to open a network connection (to a listener the test starts); an "ok" verdict with the
# listener seeing no connection means the network was closed to it.
import socket

import torch

PORT = __PORT__


class ModelNew(torch.nn.Module):
    def forward(self, x, y):
        try:
            socket.create_connection(("127.0.0.1", PORT), timeout=0.5).close()
        except OSError:
            pass
        return torch.relu(x) + y
