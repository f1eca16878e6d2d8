# reference: relu_add
# expect: incorrect|rejected
# check: output_structure|runs_to_completion
# Behaves through warm-up, then returns a thousand tiny tensors per call: whatever the parent does per
# output (overlap tests, reading) must not let this cost it more than the candidate's own time. A
# window with two such calls sends a reply larger than calls shaped like the reference's (one output)
# can take, refused from its frame's length (reply_limit.py: rejected); a window where only its last
# call is one is judged on its outputs (incorrect). Which comes first depends on how many calls the
# window where it changes holds.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, y):
        self.calls += 1
        if self.calls <= 4:
            return torch.relu(x) + y
        return tuple(torch.zeros(1) for _ in range(1000))
