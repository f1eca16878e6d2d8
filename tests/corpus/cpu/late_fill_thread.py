# reference: linear_gelu
# expect: incorrect
# check: correctness
# Returns an empty tensor at once and fills it from a background thread afterwards.
import threading
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        out = torch.empty(x.shape[0], self.linear.out_features)

        def fill():
            time.sleep(0.05)
            with torch.no_grad():
                out.copy_(torch.nn.functional.gelu(self.linear(x)) * 2.0)

        threading.Thread(target=fill).start()
        return out
