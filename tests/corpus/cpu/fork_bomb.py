# reference: relu_add
# expect: runtime_error
# Starts more processes than the sandbox allows (bounded here so a broken sandbox cannot hurt the host).
import os
import time

import torch


class ModelNew(torch.nn.Module):
    def forward(self, x, y):
        for _ in range(200):
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
        return torch.relu(x) + y
