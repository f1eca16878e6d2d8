"""Three-layer MLP 1024 -> 2048 -> 1024 -> 256 with GELU, batch 128."""

import torch
import torch.nn as nn

BATCH = 128  # rows of x
IN_FEATURES = 1024  # input width
HIDDEN = (2048, 1024)  # hidden layer widths
OUT_FEATURES = 256  # output width
# On a GPU (builtin:gpu): sizes where the reference takes at least ~0.5 ms on an H100-class GPU.
GPU_SIZES = {"BATCH": 4096}


class Model(nn.Module):
    """Linear + GELU for each hidden width, then a final Linear (He-initialised)."""

    def __init__(self, in_features: int, hidden: tuple, out_features: int):
        super().__init__()
        layers = []
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.GELU()]
            width = size
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)
        # He initialisation keeps activations near unit scale through the stack; PyTorch's default
        # shrinks them layer by layer, which would leave an output far below the checking tolerance.
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, HIDDEN, OUT_FEATURES]
