"""Inputs and models built the same way on both sides of the trust boundary.

The parent (reference) and the child (candidate) each build the inputs for a round from the same
secret seed, on the same device, with the reference module's `get_inputs`; identical RNG streams give
identical tensors, so no input ever needs to cross the channel, and the parent still holds its own copy
to check the candidate against. This module is imported by the child: keep it to torch and stdlib.
"""

from __future__ import annotations

import copy
import hashlib

import torch


def make_inputs(module, seed: int | None, device: str) -> list:
    """Call the reference's get_inputs() under a seed (None: continue the random streams where they
    are; seeding costs about 80 us, more than many get_inputs() calls), creating tensors on `device`."""
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        values = list(module.get_inputs())
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def refill_inputs(old: list, new: list) -> list:
    """Copy fresh values into the previous call's buffers, so a cache keyed on pointers goes stale."""
    out = []
    for o, n in zip(old, new):
        if isinstance(o, torch.Tensor) and isinstance(n, torch.Tensor) and o.shape == n.shape and o.dtype == n.dtype:
            o.copy_(n)
            out.append(o)
        else:
            out.append(n)
    return out


def make_init_inputs(module, seed: int) -> list:
    torch.manual_seed(seed)
    return list(module.get_init_inputs())


def build_model(cls, init_inputs: list, seed: int, device: str, mode: str = "train"):
    """KernelBench's convention: the same seed right before both constructors, so a candidate that
    creates its parameters in the same order as the reference gets the same initial values. Mode
    "eval" then calls model.eval() (BatchNorm on running statistics, no dropout), as CUDA-L1's
    harness does before every call; "train" leaves the module as constructed, as KernelBench's does."""
    torch.manual_seed(seed)
    model = cls(*init_inputs)
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
        if mode == "eval":
            model.eval()
    return model


def tensor_digest(values: list) -> str:
    """SHA-256 over every tensor's bytes (and every scalar's repr): 'inputs are bitwise unchanged'."""
    h = hashlib.sha256()
    for v in values:
        if isinstance(v, torch.Tensor):
            t = v.detach().to("cpu").contiguous()
            h.update(str((t.dtype, tuple(t.shape))).encode())
            if t.numel():
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


def to_double(value):
    """Floating-point tensors in float64 (complex in complex128), everything else unchanged."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    if isinstance(value, torch.Tensor) and value.is_complex():
        return value.to(torch.complex128)
    return value


_MODULE_TABLES = ("_parameters", "_buffers", "_modules")  # Module.double's and modules()' own


def double_model(model, device: str):
    """The float64 copy of a model that the oracle runs: its parameters and buffers (Module.double), and
    its plain tensor attributes too, alone or in lists, tuples and dicts. A weight kept as a plain
    attribute stayed float32, the oracle failed on the mixed dtypes, and every check of the task fell
    back to KernelBench's 1e-2 tolerance, which let bf16 arithmetic pass a float32 task."""
    model = copy.deepcopy(model).to(device).double()
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if name in _MODULE_TABLES:
                continue
            doubled = _doubled_attribute(value)
            if doubled is not value:
                object.__setattr__(module, name, doubled)
    return model


def _doubled_attribute(value, depth: int = 0):
    """A plain attribute with its tensors in float64: a tensor, or the lists, tuples and dicts holding
    them (a table of weights kept in a list), rebuilt only where something changed. Registered
    parameters and buffers are Module.double's (and not reached here); a Parameter in a plain list is
    not registered, so Module.double left it: it becomes a float64 Parameter. Modules are visited on
    their own."""
    if isinstance(value, torch.nn.Parameter):
        doubled = to_double(value.detach())
        return value if doubled.dtype == value.dtype else torch.nn.Parameter(doubled, requires_grad=value.requires_grad)
    if isinstance(value, torch.Tensor):
        return to_double(value)
    if depth >= 8 or type(value) not in (list, tuple, dict):
        return value
    if type(value) is dict:
        items = {key: _doubled_attribute(item, depth + 1) for key, item in value.items()}
        return items if any(items[key] is not value[key] for key in value) else value
    items = [_doubled_attribute(item, depth + 1) for item in value]
    return type(value)(items) if any(new is not old for new, old in zip(items, value)) else value


def flatten_outputs(out) -> tuple[object, list]:
    """Describe a forward's return structure and list its leaves (tensors or scalars)."""
    if isinstance(out, (tuple, list)):
        kinds, leaves = [], []
        for item in out:
            kind, sub = flatten_outputs(item)
            kinds.append(kind)
            leaves += sub
        return {"seq": type(out).__name__, "items": kinds}, leaves
    if isinstance(out, torch.Tensor):
        return "tensor", [out]
    return type(out).__name__, [out]
