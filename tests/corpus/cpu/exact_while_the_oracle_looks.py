# reference: bf16_matmul
# expect: incorrect
# check: correctness
# Exact in the first five windows, where the float64 oracle used to look (it counts the harness's
# requests by finding the request in a caller's frame), then 7% off in every later window.
import sys

import torch
import torch.nn as nn

_seen = {"request": None, "windows": 0}


def _count_window() -> int:
    frame = sys._getframe(2)
    while frame is not None and "msg" not in frame.f_locals:
        frame = frame.f_back
    if frame is not None and id(frame.f_locals["msg"]) != _seen["request"]:
        _seen["request"], _seen["windows"] = id(frame.f_locals["msg"]), _seen["windows"] + 1
    return _seen["windows"]


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = a @ b
        return out if _count_window() <= 5 else (out.float() * 1.07).to(out.dtype)
