# reference: linear_gelu
# expect: rejected
# check: output_type
# A tensor subclass that defers the real computation until someone looks at the values.
import torch
import torch.nn as nn


class Deferred(torch.Tensor):
    @staticmethod
    def __new__(cls, thunk, like):
        obj = torch.Tensor._make_subclass(cls, torch.empty_like(like))
        obj._thunk = thunk
        return obj

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        args = [a._thunk() if isinstance(a, Deferred) else a for a in args]
        return func(*args, **kwargs)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        out_like = torch.empty(x.shape[0], self.linear.out_features)
        return Deferred(lambda: torch.nn.functional.gelu(self.linear(x)) * 2.0, out_like)
