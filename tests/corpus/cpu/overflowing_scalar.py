# reference: linear_gelu_scale
# expect: incorrect
# Does no work and answers the scalar output with an int too large for a float, under a class named
# `float` so the output's structure matches the reference's. Subtracting it from 2.0 raised
# OverflowError in the parent: an evaluator failure, judged again later, instead of a wrong output.
import torch.nn as nn


class float(int):  # noqa: A001 - the structure names the class
    pass


class ModelNew(nn.Module):
    def __init__(self, width):
        super().__init__()

    def forward(self, x):
        return x[:0], float(10 ** 400)
