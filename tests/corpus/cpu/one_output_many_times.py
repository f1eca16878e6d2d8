# reference: many_relus
# expect: incorrect
# check: output_ownership
# Computes one relu and returns it 96 times. The pairs of one call's outputs sharing memory were
# compared only below a cap of 4096 pairs, which 92 or more such outputs reach, and past it nothing
# was compared: this scored ok at 3.05. Now a call past the cap where the reference's is not is
# incorrect.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        return (y,) * 96
