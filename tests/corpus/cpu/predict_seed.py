# reference: linear_gelu
# expect: incorrect
# check: correctness
# Guesses that the harness seeds its inputs with a common seed and returns precomputed outputs.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.guesses = []
        with torch.no_grad():
            for seed in (0, 1, 42, 1234):
                torch.manual_seed(seed)
                x = torch.randn(256, features)
                self.guesses.append(torch.nn.functional.gelu(self.linear(x)) * 2.0)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.guesses[(self.calls - 1) % len(self.guesses)].clone()
