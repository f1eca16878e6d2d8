"""How launch-bound a reference is on a GPU widens the spread between processes (launch_share.py)."""

from __future__ import annotations

import pytest
import torch

from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.launch_share import launch_share, spread_for
from cuda_l1.evaluate.speedup_stats import conservative_speedup
from cuda_l1.evaluate.timing import process_spread, widen


def test_the_spread_moves_with_the_launch_share_on_a_gpu_only():
    gpu, cpu = EvalConfig(device="cuda"), EvalConfig(device="cpu")
    assert process_spread(gpu) == process_spread(gpu, None) == 0.0075  # not measured: the device's own
    assert process_spread(gpu, 0.0) == 0.0075
    assert process_spread(gpu, 1.0) == 0.04
    assert 0.0075 < process_spread(gpu, 0.5) < 0.04
    assert process_spread(gpu, 7.0) == 0.04 and process_spread(gpu, -1.0) == 0.0075  # clamped to [0, 1]
    assert process_spread(cpu, 0.0) == process_spread(cpu, 1.0) == 0.04
    # A spread the caller set is kept, whatever the task.
    assert process_spread(EvalConfig(device="cuda", timing=TimingConfig(process_spread=0.01)), 1.0) == 0.01
    assert spread_for(0.25, 0.0, 0.04) == pytest.approx(0.01)


def test_identical_code_on_a_launch_bound_task_scores_as_a_cpu_sides_would():
    # Identical code on many_small_ops on an H100, three pairs of processes: 0.948 (rounds' interval
    # 0.933-0.966), 1.086 (1.069-1.10) and 1.128 (1.109-1.148). With the device-paced spread they
    # scored 0.98, 1.06 and 1.10; with the launch-bound one 1.00, 1.00 and 1.04.
    readings = ((0.948, 0.933, 0.966), (1.086, 1.069, 1.10), (1.128, 1.109, 1.148))
    narrow = [conservative_speedup(p, *widen(p, lo, hi, 0.0075)) for p, lo, hi in readings]
    wide = [conservative_speedup(p, *widen(p, lo, hi, 0.04)) for p, lo, hi in readings]
    assert narrow == [0.98, 1.06, 1.1] and wide == [1.0, 1.0, 1.04]
    # A real 2x on such a task keeps most of its score.
    assert conservative_speedup(2.0, *widen(2.0, 1.95, 2.05, 0.04)) >= 1.8


@pytest.mark.gpu
def test_a_forward_of_small_kernels_is_launch_bound_and_a_large_matmul_is_not():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    x = torch.randn(4096, device="cuda")

    def small_ops():
        y = x
        for i in range(10):
            y = torch.tanh(y) * 1.5 + 0.1 * i
        return y

    a = torch.randn(8192, 8192, device="cuda")
    small_ops(), a @ a  # warm: kernels loaded, cuBLAS's handle made
    small, large = launch_share(small_ops, "cuda"), launch_share(lambda: a @ a, "cuda")
    assert small > 0.6, small
    assert large < 0.2, large
