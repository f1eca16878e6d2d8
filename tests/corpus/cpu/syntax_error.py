# reference: relu_add
# expect: compile_error
import torch
class ModelNew(torch.nn.Module)
    pass
