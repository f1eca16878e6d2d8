# reference: relu_add
# expect: ok
# Tries to write a file outside its scratch directory (the test checks the file never appears).
import torch

TARGET = "__TARGET_FILE__"


class ModelNew(torch.nn.Module):
    def forward(self, x, y):
        try:
            with open(TARGET, "w") as fh:
                fh.write("escaped")
        except OSError:
            pass
        return torch.relu(x) + y
