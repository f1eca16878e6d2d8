"""The one-line KernelBench-format tasks many tests judge, and an untimed CPU evaluator config for them."""

from __future__ import annotations

from cuda_l1.evaluate.config import EvalConfig, TimingConfig


def one_line_task(forward: str, shape: str = "64") -> str:
    """A task whose Model returns `forward` (an expression of its input `x`) on one random input of
    `shape` (the arguments of torch.randn), with no init inputs."""
    return f'''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return {forward}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
'''


def untimed_cpu_config(fork_server: bool = True) -> EvalConfig:
    """Checks only (no timing), one trial, no prewarm: what a test of loading and checking needs."""
    timing = TimingConfig.quick()
    timing.enabled = False
    config = EvalConfig(device="cpu", timing=timing, correctness_trials=1, prewarm=False)
    config.sandbox.fork_server = fork_server
    return config
