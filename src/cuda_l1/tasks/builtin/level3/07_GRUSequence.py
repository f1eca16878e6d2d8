"""Two-layer nn.GRU (128 -> 256) over 32 steps of 16 sequences, all outputs."""

import torch
import torch.nn as nn

BATCH = 16  # sequences
STEPS = 32  # time steps
INPUT_SIZE = 128  # width of each step's input
HIDDEN_SIZE = 256  # width of the hidden state
LAYERS = 2  # stacked GRU layers
INPUT_SCALE = 3.0  # spread of the step inputs, so the gates are driven well away from their resting values
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 64, "STEPS": 128, "INPUT_SIZE": 256, "HIDDEN_SIZE": 512}


class Model(nn.Module):
    """(x, h0) -> outputs of shape (BATCH, STEPS, HIDDEN_SIZE); a sequential, latency-bound recurrence."""

    def __init__(self, input_size: int, hidden_size: int, layers: int):
        super().__init__()
        self.gru = nn.GRU(input_size, hidden_size, num_layers=layers, batch_first=True)

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        outputs, _ = self.gru(x, h0)
        return outputs


def get_inputs():
    x = torch.randn(BATCH, STEPS, INPUT_SIZE) * INPUT_SCALE
    h0 = torch.randn(LAYERS, BATCH, HIDDEN_SIZE) * 0.5
    return [x, h0]


def get_init_inputs():
    return [INPUT_SIZE, HIDDEN_SIZE, LAYERS]
