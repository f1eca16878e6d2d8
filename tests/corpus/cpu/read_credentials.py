# reference: relu_add
# expect: ok
# Looks for credentials in its environment and in a secret file outside its scratch directory; returns
# a wrong answer if it finds any. An "ok" verdict therefore means it found nothing.
import os

import torch

SECRET_FILE = "__SECRET_FILE__"


def _found_secret() -> bool:
    for name, value in os.environ.items():
        if "sk-test-" in value or name in ("OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN"):
            return True
    try:
        with open(SECRET_FILE) as fh:
            return "sk-test-" in fh.read()
    except OSError:
        return False


class ModelNew(torch.nn.Module):
    def forward(self, x, y):
        if _found_secret():
            return torch.zeros_like(x)
        return torch.relu(x) + y
