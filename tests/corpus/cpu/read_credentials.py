# reference: relu_add
# expect: ok
# Looks for credentials in its environment and in a secret file outside its scratch directory; returns
# a wrong answer if it finds any. An "ok" verdict therefore means it found nothing.
import os

import torch

SECRET_FILE = "__SECRET_FILE__"
EVALUATOR_PID = "__EVALUATOR_PID__"


def _found_secret() -> bool:
    for name, value in os.environ.items():
        if "sk-test-" in value or name in ("OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN"):
            return True
    try:
        with open(SECRET_FILE) as fh:
            if "sk-test-" in fh.read():
                return True
    except OSError:
        pass
    # Other processes' environments through /proc: the evaluator's own (its pid is given to this
    # candidate, as if guessed), and any other listed process.
    try:
        pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        pids = []
    for pid in [EVALUATOR_PID] + pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if b"sk-test-" in fh.read():
                    return True
        except OSError:
            continue
    return False


class ModelNew(torch.nn.Module):
    def forward(self, x, y):
        if _found_secret():
            return torch.zeros_like(x)
        return torch.relu(x) + y
