# reference: relu_add
# expect: runtime_error
# Starts 4,500 threads with small stacks and keeps them. No process limit sees threads, and without a
# pids controller nothing else stops a side from taking the host's whole pid space (pid_max) this way.
import threading

import torch

threading.stack_size(64 << 10)
_release = threading.Event()
_threads = [threading.Thread(target=_release.wait, daemon=True) for _ in range(4500)]
for _thread in _threads:
    _thread.start()


class ModelNew(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x) + y
