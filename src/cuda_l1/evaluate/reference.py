"""The trusted reference: built once per task in the evaluator's own process, never near candidate code.

It makes the inputs for a seed, the reference outputs, the float64 oracle outputs, and times reference
calls with exactly the timing code the child uses for the candidate (timer.py).
"""

from __future__ import annotations

import copy
import secrets

import torch

from cuda_l1.evaluate import inputs as inputs_mod
from cuda_l1.evaluate import timer
from cuda_l1.tasks import Task
from cuda_l1.tasks.runtime import check_forward_args, check_init_args, load_task_module


def set_precision_policy() -> None:
    """Reference and candidate both run without TF32 so that 'same precision' means fp32 is fp32."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def _to_double(value):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    return value


class PreparedReference:
    """A task's reference model on a device, with a secret initialisation seed."""

    def __init__(self, task: Task, device: str, init_seed: int | None = None, flush_cache: bool = True):
        set_precision_policy()
        self.task = task
        self.device = device
        self.init_seed = init_seed if init_seed is not None else secrets.randbits(62)
        self.module = load_task_module(task, module_name=f"cuda_l1_ref_{task.id}")
        origin = task.origin or task.name
        init_inputs = check_init_args(inputs_mod.make_init_inputs(self.module, self.init_seed), origin)
        self.model = inputs_mod.build_model(self.module.Model, init_inputs, self.init_seed, device)
        check_forward_args(inputs_mod.make_inputs(self.module, 0, device), origin)
        self._oracle_model = None
        self.oracle_device: str | None = device
        self.flusher = timer.Flusher(device, timer.flush_bytes(device)) if flush_cache else None
        self._last_inputs: list | None = None
        self.cache_bytes = 2 * 2**30  # budget for correctness sets kept across candidates

    # -- values --------------------------------------------------------------------------------------
    def inputs(self, seed: int, same_buffers: bool = False) -> list:
        fresh = inputs_mod.make_inputs(self.module, seed, self.device)
        if same_buffers and self._last_inputs is not None:
            fresh = inputs_mod.refill_inputs(self._last_inputs, fresh)
        self._last_inputs = fresh
        return fresh

    def outputs(self, args: list):
        with torch.no_grad():
            out = self.model(*args)
        timer.sync(self.device)
        return inputs_mod.flatten_outputs(out)

    def oracle(self, args: list) -> list | None:
        """Leaves of the reference computed in float64 (on the device, else on the CPU), or None when
        the task cannot run in float64 at all."""
        for device in [self.oracle_device, "cpu"] if self.oracle_device != "cpu" else ["cpu"]:
            if device is None:
                continue
            try:
                if self._oracle_model is None or self._oracle_on != device:
                    self._oracle_model = copy.deepcopy(self.model).to(device).double()
                    self._oracle_on = device
                with torch.no_grad():
                    out = self._oracle_model(*[_to_double(a.to(device) if isinstance(a, torch.Tensor) else a) for a in args])
                _, leaves = inputs_mod.flatten_outputs(out)
                self.oracle_device = device
                return [leaf.detach().cpu() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
            except Exception:
                self._oracle_model = None
                continue
        self.oracle_device = None
        return None

    # -- correctness input sets ------------------------------------------------------------------------
    def correctness_set(self, trial: int, with_oracle: bool) -> dict:
        """Seed, reference leaves, oracle leaves and input digest of correctness trial `trial`.

        Kept and reused for later candidates of this task when they are small enough (the reference
        and oracle runs are most of the parent's work per candidate); the seeds stay secret, and a
        candidate has no way to pass what it saw to the next one (its scratch directory is deleted
        and it can write nowhere else)."""
        cache = self.__dict__.setdefault("_sets", {})
        if trial in cache:
            return cache[trial]
        seed = secrets.randbits(62)
        args = self.inputs(seed)
        structure, leaves = self.outputs(args)
        entry = {
            "seed": seed,
            "structure": structure,
            "leaves": [leaf.detach().cpu() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves],
            "oracle": self.oracle(args) if with_oracle else None,
            "digest": inputs_mod.tensor_digest(args),
            "device_leaves": leaves,
        }
        size = sum(x.numel() * x.element_size() for x in entry["leaves"] if isinstance(x, torch.Tensor))
        if size * 3 <= self.cache_bytes:  # leaves + float64 oracle
            self.cache_bytes -= size * 3
            cache[trial] = entry
        return entry

    # -- time ----------------------------------------------------------------------------------------
    def time_once(self, seed: int, same_buffers: bool):
        args = self.inputs(seed, same_buffers)
        timer.sync(self.device)
        with torch.no_grad():
            out, call_time = timer.time_call(self.model, args, self.device, self.flusher)
        _, leaves = inputs_mod.flatten_outputs(out)
        return leaves, call_time
