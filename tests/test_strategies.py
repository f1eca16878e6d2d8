"""Offline strategies: the generated candidates build like Model and compute what Model computes."""

from __future__ import annotations

import ast
import itertools
import sys

import pytest
import torch

from cuda_l1.errors import TaskError, UserError
from cuda_l1.strategies import STRATEGIES, applicable, baseline_names, get_strategy
from cuda_l1.strategies.base import BANNER
from cuda_l1.tasks import load_builtin, make_task
from cuda_l1.tasks.runtime import load_module

LINEAR_RELU = '''
"""Two linear layers with ReLU: parameters created in a fixed order."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.first = nn.Linear(in_features, hidden)
        self.second = nn.Linear(hidden, out_features)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def get_inputs():
    return [torch.randn(8, 32)]


def get_init_inputs():
    return [32, 64, 16]
'''

SCALE_SHIFT = '''
"""Elementwise: a scalar from the constructor and one from forward's arguments."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, shift):
        super().__init__()
        self.shift = shift

    def forward(self, x, scale):
        return torch.tanh(x * scale) + self.shift


def get_inputs():
    return [torch.randn(4, 128), 0.5]


def get_init_inputs():
    return [0.25]
'''

TUPLE_WITH_BUFFER = '''
"""Two outputs, a registered buffer and a parameter; two tensor inputs."""
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features, features) * 0.1)
        self.register_buffer("offset", torch.linspace(-1.0, 1.0, features))

    def forward(self, a, b):
        mixed = a @ self.weight + self.offset
        return mixed.sum(dim=-1), torch.maximum(mixed, b)


def get_inputs():
    return [torch.randn(6, 24), torch.randn(6, 24)]


def get_init_inputs():
    return [24]
'''

TASKS = {
    "linear_relu": make_task(LINEAR_RELU, name="1_LinearReLU", level=1, origin="test:linear_relu"),
    "scale_shift": make_task(SCALE_SHIFT, name="2_ScaleShift", level=1, origin="test:scale_shift"),
    "tuple_buffer": make_task(TUPLE_WITH_BUFFER, name="3_TupleBuffer", level=2, origin="test:tuple_buffer"),
}

_module_numbers = itertools.count()


def builtin_tasks() -> list:
    try:
        return load_builtin()
    except TaskError:  # the built-in suite may still be empty
        return []


@pytest.fixture
def load_candidate():
    """Execute a generated source as a fresh module; forget the module afterwards."""
    names = []

    def load(source: str):
        name = f"cuda_l1_test_candidate_{next(_module_numbers)}"
        names.append(name)
        return load_module(source, name, f"<{name}>")

    yield load
    for name in names:
        sys.modules.pop(name, None)


def build_pair(module, seed: int = 1234, device: str = "cpu"):
    """Model and ModelNew built as the evaluator builds them: same seed, same constructor arguments."""
    init = module.get_init_inputs()
    torch.manual_seed(seed)
    reference = module.Model(*init).to(device)
    torch.manual_seed(seed)
    candidate = module.ModelNew(*init).to(device)
    return reference, candidate


def fresh_inputs(module, seed: int, device: str = "cpu") -> list:
    torch.manual_seed(seed)
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in module.get_inputs()]


def assert_same_state(reference, candidate):
    ref_state, new_state = reference.state_dict(), candidate.state_dict()
    assert list(ref_state) == list(new_state)
    for key in ref_state:
        assert torch.equal(ref_state[key], new_state[key]), key


def check_matches_reference(module, calls: int = 3, device: str = "cpu", **tolerance):
    """Fresh inputs on every call; each result is compared with the reference on the same inputs."""
    reference, candidate = build_pair(module, device=device)
    assert_same_state(reference, candidate)
    kept = []
    with torch.no_grad():
        for call in range(calls):
            inputs = fresh_inputs(module, seed=100 + call, device=device)
            expected = reference(*inputs)
            got = candidate(*inputs)
            torch.testing.assert_close(got, expected, **tolerance)
            kept.append((got, expected))
        # Earlier results must not change when later calls run (no shared output buffers).
        for got, expected in kept:
            torch.testing.assert_close(got, expected, **tolerance)


# ---------------------------------------------------------------- registry


def test_registry_and_baselines():
    assert set(STRATEGIES) == {"eager", "compile", "compile-max", "compile-ro", "cudagraph"}
    assert baseline_names() == ["eager", "compile", "compile-ro", "cudagraph"]
    assert all(name in STRATEGIES for name in baseline_names())
    for name, strategy in STRATEGIES.items():
        assert strategy.name == name and strategy.description
    assert get_strategy("compile") is STRATEGIES["compile"]
    with pytest.raises(UserError, match="cudagraph"):
        get_strategy("cuda-graph")


def test_cuda_graph_strategies_are_skipped_on_cpu_with_a_note():
    on_cpu = applicable("cpu")
    for name in ("cudagraph", "compile-ro"):
        applies, note = on_cpu[name]
        assert applies is False
        assert "CUDA" in note and "cpu" in note
    for name in ("eager", "compile", "compile-max"):
        assert on_cpu[name] == (True, "")
    for device in ("cuda", "cuda:1", "NVIDIA H200"):
        assert STRATEGIES["cudagraph"].applies(device) == (True, "")
        assert STRATEGIES["compile-ro"].applies(device) == (True, "")


def test_a_bench_takes_its_tasks_one_at_a_time_with_all_of_their_strategies():
    """A worker holds the references of its last few tasks only: one task's strategies back to back
    share its prepared reference, strategy by strategy they did not (bench.strategy_candidates)."""
    from cuda_l1.bench import strategy_candidates

    tasks = [TASKS[key] for key in sorted(TASKS)[:3]]
    candidates, notes = strategy_candidates(tasks, ["eager", "compile-ro", "compile"], "cpu")
    assert [(c.task.id, c.label) for c in candidates] == [(t.id, name) for t in tasks for name in ("eager", "compile")]
    assert len(notes) == 1 and "compile-ro" in notes[0]


# ---------------------------------------------------------------- generated sources, statically


def _generated_part(source: str, name: str) -> str:
    return source.split(BANNER.format(name=name), 1)[1]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("task_key", sorted(TASKS))
def test_generated_source_parses_and_defines_model_new(name, task_key):
    task = TASKS[task_key]
    source = STRATEGIES[name].generate(task)
    tree = ast.parse(source)
    assert source.startswith(task.source.rstrip())  # the reference comes first, unchanged
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    assert "ModelNew" in classes and "Model" in classes
    assert [ast.unparse(b) for b in classes["ModelNew"].bases] == ["Model"]  # same constructor, same params

    generated = ast.parse(_generated_part(source, name))
    for node in ast.walk(generated):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id != "print", f"{name} prints"
        if isinstance(node, ast.Attribute):
            assert "tf32" not in node.attr and node.attr != "set_float32_matmul_precision", f"{name}: {node.attr}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            assert all(m.split(".")[0] == "torch" for m in modules), f"{name} imports {modules}"


# ---------------------------------------------------------------- running on CPU


@pytest.mark.parametrize("task_key", sorted(TASKS))
def test_eager_is_the_reference(task_key, load_candidate):
    module = load_candidate(STRATEGIES["eager"].generate(TASKS[task_key]))
    check_matches_reference(module, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("task_key", ["linear_relu", "tuple_buffer"])
def test_compile_matches_reference_on_cpu(task_key, load_candidate):
    module = load_candidate(STRATEGIES["compile"].generate(TASKS[task_key]))
    check_matches_reference(module, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_compile_max_autotune_matches_reference_on_cpu(load_candidate):
    module = load_candidate(STRATEGIES["compile-max"].generate(TASKS["scale_shift"]))
    check_matches_reference(module, rtol=1e-4, atol=1e-5)


def test_cudagraph_refuses_to_run_without_cuda(load_candidate):
    module = load_candidate(STRATEGIES["cudagraph"].generate(TASKS["linear_relu"]))
    _, candidate = build_pair(module)
    with pytest.raises(RuntimeError, match="CUDA"):
        candidate(*fresh_inputs(module, seed=0))


@pytest.mark.slow
@pytest.mark.parametrize("task", builtin_tasks(), ids=lambda t: t.key)
def test_eager_on_builtin_suite(task, load_candidate):
    for name in STRATEGIES:
        assert "ModelNew" in {n.name for n in ast.parse(STRATEGIES[name].generate(task)).body
                              if isinstance(n, ast.ClassDef)}
    module = load_candidate(STRATEGIES["eager"].generate(task))
    check_matches_reference(module, calls=1, rtol=0, atol=0)


# ---------------------------------------------------------------- running on CUDA


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cudagraph", "compile-ro", "compile"])
@pytest.mark.parametrize("task_key", sorted(TASKS))
def test_cuda_strategies_match_reference_with_fresh_inputs(name, task_key, load_candidate):
    module = load_candidate(STRATEGIES[name].generate(TASKS[task_key]))
    tolerance = {} if name == "cudagraph" else {"rtol": 1e-4, "atol": 1e-5}
    check_matches_reference(module, calls=4, device="cuda", **tolerance)


@pytest.mark.gpu
def test_cudagraph_recaptures_on_new_shapes_and_sees_new_weights(load_candidate):
    module = load_candidate(STRATEGIES["cudagraph"].generate(TASKS["linear_relu"]))
    reference, candidate = build_pair(module, device="cuda")
    with torch.no_grad():
        for batch in (8, 8, 3, 8):  # a new batch size means a new input signature
            x = torch.randn(batch, 32, device="cuda")
            torch.testing.assert_close(candidate(x), reference(x))
        # Weights loaded in place after capture are read by the next replay, not a stale copy.
        torch.manual_seed(99)
        other = module.Model(*module.get_init_inputs()).cuda()
        reference.load_state_dict(other.state_dict())
        candidate.load_state_dict(other.state_dict())
        x = torch.randn(8, 32, device="cuda")
        torch.testing.assert_close(candidate(x), reference(x))
        # Moving the module drops the graph: float64 parameters and inputs still give the right answer.
        reference.double()
        candidate.double()
        x = x.double()
        torch.testing.assert_close(candidate(x), reference(x))


@pytest.mark.gpu
@pytest.mark.parametrize("task", builtin_tasks(), ids=lambda t: t.key)
def test_cudagraph_on_builtin_suite(task, load_candidate):
    module = load_candidate(STRATEGIES["cudagraph"].generate(task))
    check_matches_reference(module, calls=2, device="cuda")
