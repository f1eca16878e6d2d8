"""The float64 oracle runs references whose forward makes its own float32 tensors: without it, every check
fell back to KernelBench's 1e-2 tolerance, and an LSTM that skipped 7 of its 8 steps in 8 passed."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.evaluate.inputs import double_model, to_double
from cuda_l1.evaluate.oracle_run import forward_in_float64
from cuda_l1.tasks import Task

LSTM_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.fc = nn.Linear(32, 8)

    def forward(self, x):
        h0 = torch.zeros(2, x.size(0), 32, device=x.device)  # the default dtype: float32 beside a float64 copy
        c0 = torch.zeros(2, x.size(0), 32, device=x.device)
        out, _ = self.lstm(x, (h0, c0))
        return self.fc(out[:, -1, :])


def get_inputs():
    return [torch.randn(4, 32, 16)]


def get_init_inputs():
    return []
'''

# Runs the recurrence over the last 4 of the 32 steps only.
TRUNCATED = LSTM_TASK.replace("class Model(", "class ModelNew(").replace(
    "out, _ = self.lstm(x, (h0, c0))", "out, _ = self.lstm(x[:, -4:, :], (h0, c0))")


class ExplicitFloat32(nn.Module):
    """Tensors made with an explicit float32 dtype, and a `.float()`: default dtype alone does not reach them."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        mix = torch.full((8, 8), 0.125, dtype=torch.float32)  # a matmul does not promote: mixed dtypes raise
        return self.linear(x) @ mix + torch.arange(8).float()


def correctness_verdicts(task: Task, sources: list[str]) -> list:
    """The verdicts of `sources` on `task`, correctness only, on the CPU."""
    timing = TimingConfig.quick()
    timing.enabled = False
    evaluator = Evaluator(task, EvalConfig(device="cpu", timing=timing, correctness_trials=2))
    try:
        return [evaluator.evaluate(source) for source in sources]
    finally:
        evaluator.close()


@pytest.mark.parametrize("model", [ExplicitFloat32(), None])
def test_the_oracle_is_float64_where_the_forward_makes_float32_tensors(model):
    if model is None:
        namespace: dict = {}
        exec(compile(LSTM_TASK, "lstm_task.py", "exec"), namespace)
        model = namespace["Model"]()
        x = torch.randn(4, 32, 16)
    else:
        x = torch.randn(3, 8)
    with pytest.raises(RuntimeError):  # what the oracle did before: the mixed dtypes raise
        double_model(model, "cpu")(to_double(x))
    out = forward_in_float64(double_model(model, "cpu"), [to_double(x)])
    assert out.dtype == torch.float64
    assert torch.allclose(out.float(), model(x), atol=1e-5)


def test_a_forward_that_fails_for_another_reason_reports_its_own_error():
    class Broken(nn.Module):
        def forward(self, x):
            raise ValueError("this reference fails in its own way")

    with pytest.raises(ValueError, match="its own way"):
        forward_in_float64(Broken(), [torch.randn(2)])


def test_an_lstm_that_skips_most_of_its_steps_is_incorrect_not_passed_at_a_loose_tolerance():
    same, truncated = correctness_verdicts(Task(name="1_LSTMZeros", level=3, source=LSTM_TASK),
                                           [LSTM_TASK.replace("class Model(", "class ModelNew("), TRUNCATED])
    assert same.status == "ok", same.reasons
    correctness = same.check("correctness").detail
    assert "no float64 oracle" not in correctness and "against float64" in correctness
    assert truncated.status == "incorrect", (truncated.status, truncated.reasons)
    assert "vs float64" in " ".join(truncated.reasons)


FLOAT32_ONLY = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        if x.dtype != torch.float32:
            raise TypeError("this reference runs in float32 only")
        return torch.tanh(x) * 2


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''


def test_a_reference_without_a_float64_run_is_said_to_be_held_to_kernelbench_tolerance_only():
    """The correctness detail said "in full against float64" when nothing had been compared with float64."""
    [verdict] = correctness_verdicts(Task(name="1_Float32Only", level=1, source=FLOAT32_ONLY),
                                     [FLOAT32_ONLY.replace("class Model(", "class ModelNew(")])
    assert verdict.status == "ok", verdict.reasons
    oracle = verdict.check("float64_oracle")
    assert oracle is not None and oracle.passed is False and not oracle.blocking
    assert "float32 only" in oracle.detail
    assert "against the reference at KernelBench's tolerance" in verdict.check("correctness").detail


SEEDED_NOISE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 64)

    def forward(self, x):
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(1234))  # the same every call
        h0 = torch.zeros(64, 64)  # float32: the oracle's first run raises on the matmul below
        return self.linear(x) @ (h0 + 1.0) / 64 + 0.5 * noise


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''


def test_a_seeded_draw_in_the_forward_is_the_same_draw_in_the_oracle():
    """With float64 as the oracle's default dtype, torch.randn drew other numbers than the reference's: the
    reference's "own error" became its noise (3.25), the allowance 32.5, and a bfloat16 candidate passed."""
    [verdict] = correctness_verdicts(Task(name="1_SeededNoise", level=1, source=SEEDED_NOISE),
                                     [SEEDED_NOISE.replace("class Model(", "class ModelNew(")])
    assert verdict.status == "ok", verdict.reasons
    detail = verdict.check("correctness").detail
    own = float(detail.split("reference's own error ")[1].split(",")[0])
    assert own < 1e-5, detail
