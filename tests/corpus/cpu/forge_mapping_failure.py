# reference: relu_add
# expect: runtime_error
# check: runs_to_completion
# Answers the parent's request to map its inputs with the harness's own "could not map" reply, which
# ended the evaluation as the evaluator's failure (judged again, never the candidate's). The request
# comes after the candidate was imported and built in that process: what it answers is the candidate's.
import sys

import torch
import torch.nn as nn

harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if m is not None and hasattr(m, "Side"))


def _map_inputs(self, msg):
    self.send(harness.Mapped(False, "OSError: [Errno 12] Cannot allocate memory"))


harness.Side.map_inputs = _map_inputs


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.relu(x) + y
