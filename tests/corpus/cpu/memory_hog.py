# reference: relu_add
# expect: runtime_error
# Allocates far more memory than the sandbox allows.
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x, y):
        hoard = []
        for _ in range(64):
            hoard.append(torch.ones(1 << 28, dtype=torch.uint8))  # 256 MiB each
        return torch.relu(x) + y
