"""The built-in suite's GPU sizes: every task has them, they are larger, they are consistent (the model
builds and forward runs on torch's meta device), and they are a different task from the CPU copy."""

from __future__ import annotations


import pytest

from cuda_l1.devices import Device
from cuda_l1.errors import TaskError
from cuda_l1.tasks import for_device, load_builtin, load_tasks
from cuda_l1.tasks.loaders import builtin_gpu_sizes
from cuda_l1.tasks.runtime import meta_footprint
from cuda_l1.tasks.sizes import resize

CPU_TASKS = {t.key: t for t in load_builtin("cpu")}
GPU_TASKS = {t.key: t for t in load_builtin("gpu")}


def _shapes_on_meta(source: str) -> tuple[int, int, int]:
    """Input, output and parameter elements, with forward run on the meta device (no memory)."""
    footprint = meta_footprint(source)
    return footprint["input_elements"], footprint["output_elements"], footprint["parameters"]


# Ids of built-in tasks as they were before GPU sizes existed: stores keyed by them must stay valid.
PINNED_CPU_IDS = {"L1/01_SquareMatmul": "8b26d75cb27e", "L2/05_Linear_LayerNorm_SiLU_Mul": "c8619e760d76",
                  "L3/12_TinyUNet": "3665d91d6761"}


def test_cpu_task_ids_did_not_change():
    assert {key: CPU_TASKS[key].id for key in PINNED_CPU_IDS} == PINNED_CPU_IDS


def test_the_cpu_suite_is_what_builtin_loads():
    assert [t.id for t in load_tasks("builtin")] == [t.id for t in load_tasks("builtin:cpu")]
    assert set(CPU_TASKS) == set(GPU_TASKS) and len(GPU_TASKS) == 36
    with pytest.raises(TaskError, match="sizes cpu, gpu"):
        load_tasks("builtin:huge")


@pytest.mark.parametrize("key", sorted(GPU_TASKS))
def test_gpu_sizes_are_larger_and_consistent(key):
    cpu, gpu = CPU_TASKS[key], GPU_TASKS[key]
    assert builtin_gpu_sizes(cpu), f"{key} states no GPU_SIZES"
    assert "GPU_SIZES" not in cpu.source and "GPU_SIZES" not in gpu.source  # the CPU copy is the file as before
    assert gpu.id != cpu.id and gpu.origin.endswith("(gpu sizes)")
    small, large = _shapes_on_meta(cpu.source), _shapes_on_meta(gpu.source)
    assert all(b >= a for a, b in zip(small, large)), (small, large)
    assert large[0] + large[1] >= 8 * (small[0] + small[1]), f"{key}: GPU sizes barely larger {small} -> {large}"


def test_resize_rewrites_only_the_named_constants_and_refuses_unknown_ones():
    source = "N = 3  # rows\nM = (1, 2)\nK = N * 2\n"
    assert resize(source, {"N": 8, "M": (4, 5)}) == "N = 8  # rows\nM = (4, 5)\nK = N * 2\n"
    with pytest.raises(ValueError, match="Q"):
        resize(source, {"Q": 1})


def test_builtin_follows_the_device_and_other_sources_stay():
    assert for_device("builtin", Device("cuda")) == "builtin:gpu"
    assert for_device("builtin", Device("cuda", remote=True)) == "builtin:gpu"
    assert for_device("builtin", Device("cpu")) == "builtin:cpu"
    assert for_device("builtin", "cuda:1") == "builtin:gpu"
    assert for_device("builtin:cpu", Device("cuda")) == "builtin:cpu"  # asked for explicitly
    assert for_device("some/dir", Device("cuda")) == "some/dir"


def test_tasks_show_says_which_sizes_apply(capsys):
    from cuda_l1.cli import run

    assert run(["tasks", "show", "builtin:gpu", "L1/01"]) == 0
    out = capsys.readouterr().out
    assert "sizes: gpu" in out and "N=4096" in out and "[4096, 4096]" in out
    assert run(["tasks", "show", "builtin", "L1/01", "--json"]) == 0
    import json

    info = json.loads(capsys.readouterr().out)
    assert info["sizes"] == {"applied": "cpu", "gpu": {"N": 4096}} and info["inputs"][0]["shape"] == [1280, 1280]
