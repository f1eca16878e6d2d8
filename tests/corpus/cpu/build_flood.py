# reference: relu_add
# expect: runtime_error
# Floods the parent with BuildRequests from the first forward (through the harness's own channel,
# reached via the patched load_inline) and never reads a reply: answered, the replies would fill the
# pipe and block the parent's write for good. A module gets 16 builds; the 17th request ends it.
import sys
import time

import torch
import torch.nn as nn
from cuda_l1.evaluate.protocol import BuildRequest

harness = next(m for m in (sys.modules.get("__main__"), sys.modules.get("cuda_l1.evaluate.child"))
               if hasattr(m, "Side"))
_side = [c.cell_contents for c in torch.utils.cpp_extension.load_inline.__closure__
         if isinstance(c.cell_contents, harness.Side)][0]


class ModelNew(nn.Module):
    def forward(self, x, y):
        for _ in range(5000):
            _side.send(BuildRequest(["x"], {}))
        time.sleep(10**6)
        return torch.relu(x) + y
