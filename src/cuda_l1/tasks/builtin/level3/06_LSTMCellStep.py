"""One nn.LSTMCell step (512 -> 512, batch 64) returning [h', c']: launch-bound."""

import torch
import torch.nn as nn

BATCH = 64  # sequences advanced by one step
INPUT_SIZE = 512  # width of the step input
HIDDEN_SIZE = 512  # width of the hidden and cell states
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 2048, "INPUT_SIZE": 1024, "HIDDEN_SIZE": 1024}


class Model(nn.Module):
    """(x, h, c) -> cat([h', c'], dim=1): a launch-bound recurrent step."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.cell = nn.LSTMCell(input_size, hidden_size)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        h_next, c_next = self.cell(x, (h, c))
        return torch.cat([h_next, c_next], dim=1)


def get_inputs():
    return [
        torch.randn(BATCH, INPUT_SIZE),
        torch.randn(BATCH, HIDDEN_SIZE) * 0.5,
        torch.randn(BATCH, HIDDEN_SIZE),
    ]


def get_init_inputs():
    return [INPUT_SIZE, HIDDEN_SIZE]
