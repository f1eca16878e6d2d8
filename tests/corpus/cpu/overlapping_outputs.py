# reference: two_cats
# expect: incorrect
# check: output_ownership
# Writes [a, b, c] once and returns two overlapping views of it: 3N values written where the
# reference writes 4N, and a caller changing one output would change the other. Only outputs of
# different calls were kept apart; those of one call may now share memory only where the
# reference's do.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        n = a.numel()
        whole = torch.cat([a, b, c])
        return whole[:2 * n], whole[n:]
