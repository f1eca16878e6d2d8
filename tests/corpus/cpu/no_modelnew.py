# reference: relu_add
# expect: compile_error
import torch


class Model(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x) + y
