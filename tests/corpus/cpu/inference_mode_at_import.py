# reference: tiny_relu
# expect: ok
# score_at_most: 1.0
# The reference's own code in a module that enters inference mode at import and never leaves it: the
# mode is per thread, and the side's main thread runs the windows, so its small forwards skipped the
# version counters and view tracking that the reference's paid for (raw 1.085-1.10 on launch-bound
# tasks, 2-core CPU host). Each window runs with inference mode off on both sides, so the output,
# which adds 1 wherever the mode is still on, matches the reference's.
import torch
import torch.nn as nn

_MODE = torch.inference_mode()
_MODE.__enter__()


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x) + float(torch.is_inference_mode_enabled())
