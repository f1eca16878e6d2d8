"""On a CPU both sides touch the same amount of host heap before their first window (warmup.reserve_heap,
TaskEnv.heap_reserve_bytes): glibc's heap otherwise grew through the first windows of a task with large
outputs, page-faulting at rounds that differed between the sides, and identical code read 1.22."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cuda_l1.errors import UserError
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import evaluate
from cuda_l1.evaluate.protocol import ProtocolError, Setup
from cuda_l1.evaluate.task_env import _heap_reserve
from cuda_l1.evaluate.validate import decode
from cuda_l1.evaluate.verdict import OK
from cuda_l1.tasks import make_task
from task_sources import one_line_task

# A side's windows in miniature: each call allocates an 8 MiB output while the last window's stays
# alive, under the allocator policy both sides set (steady_host_allocator); the page faults of each.
WINDOWS = """
import json, resource, sys
import torch
from cuda_l1.evaluate.warmup import reserve_heap, steady_host_allocator
torch.set_num_threads(1)
steady_host_allocator()
x = torch.randn(8, 32, 64, 128)  # 8 MiB
reserved = reserve_heap(int(sys.argv[1]))
faults, kept = [], []
for _ in range(24):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    previous, kept = kept, [torch.softmax(x, dim=1)]
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"reserved": reserved, "faults": faults}))
"""
BLOCK_PAGES = (8 << 20) // 4096


def _windows(reserve: int) -> dict:
    done = subprocess.run([sys.executable, "-c", WINDOWS, str(reserve)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_reserved_heap_serves_every_window_without_page_faults():
    plain, reserved = _windows(0), _windows(20 * (8 << 20))
    # Without it the heap must grow into the first two blocks at least (the outputs of two windows).
    assert not plain["reserved"] and sum(plain["faults"]) >= 2 * BLOCK_PAGES
    assert reserved["reserved"]
    assert sum(reserved["faults"]) < BLOCK_PAGES // 4, reserved["faults"]


def test_nothing_is_reserved_for_nothing():
    from cuda_l1.evaluate.warmup import reserve_heap

    assert reserve_heap(0) is False


def test_both_sides_reserve_what_the_task_implies_on_a_cpu_only():
    out = 32 << 20
    cpu = EvalConfig(device="cpu")
    assert _heap_reserve(cpu, out, 1) == 20 * out  # 640 MiB: one call a window
    assert _heap_reserve(cpu, 1 << 20, 8) == 32 << 20  # small outputs, more calls a window: 4 a slot
    assert _heap_reserve(cpu, 1 << 30, 4) == cpu.heap_reserve_bytes  # capped
    assert _heap_reserve(EvalConfig(device="cpu", heap_reserve_bytes=0), out, 1) == 0
    assert _heap_reserve(EvalConfig(device="cuda"), out, 1) == 0  # the timed work is on the device
    with pytest.raises(UserError, match="heap_reserve_bytes"):
        EvalConfig(heap_reserve_bytes=-1)


def test_a_setup_carries_its_reserve_and_refuses_a_malformed_one():
    header = Setup("reference", "", "", "Model", 1, 1, "train", 640 << 20).__dict__
    assert decode(dict(header), from_side=False).heap_reserve_bytes == 640 << 20
    for bad in (-1, 1.5, "1", 1 << 41):
        with pytest.raises(ProtocolError, match="heap_reserve_bytes"):
            decode({**header, "heap_reserve_bytes": bad}, from_side=False)


def test_identical_code_with_large_outputs_faults_in_neither_sides_windows():
    """A softmax with 8 MiB outputs, one call a window (quick timing): before the reserve the sides'
    windows took 17 000-66 000 faults on the 32 MiB task of the built-in suite; now only the first
    window's own (the first call's), about the same on both sides."""
    task = make_task(one_line_task("torch.softmax(x, dim=1)", "8, 32, 64, 128"), name="1_softmax", level=1,
                     origin="test:softmax")
    verdict = evaluate(task, task.source.replace("class Model(", "class ModelNew("),
                       EvalConfig(device="cpu", timing=TimingConfig.quick()))
    assert verdict.status == OK, verdict.reasons
    sides = verdict.timing["sides"]
    for name in ("reference", "candidate"):
        assert sides[name]["window_faults"] < BLOCK_PAGES, sides
