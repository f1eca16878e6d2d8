# reference: big_relu_add
# expect: runtime_error
# Asks for more GPU memory than exists.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        hoard = torch.empty(1 << 40, dtype=torch.uint8, device=x.device)
        return torch.relu(x) + y + hoard[:1].float()
