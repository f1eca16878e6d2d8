"""A candidate's memory limit follows the task: what the reference's side holds, times a factor, plus
headroom, never below the floor and never above half the host; page cache is not counted."""

from __future__ import annotations

import os

import pytest

from cuda_l1.evaluate.cgroup import owned_from_stat
from cuda_l1.evaluate.config import EvalConfig, SandboxConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.evaluate.side_memory import candidate_limit, reference_limit
from cuda_l1.tasks import Task

MiB = 2**20
GiB = 2**30

# The reference holds a 512 MiB table: well above the 768 MiB floor once torch is in.
REFERENCE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.ones(1 << 27))

    def forward(self, x):
        return x * 2.0 + self.table[: x.numel()].view_as(x)


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''

# As large as the reference (the same table, and a scratch buffer the float64 oracle's copy outweighs).
SAME_SIZE = REFERENCE.replace("class Model(", "class ModelNew(").replace(
    '        self.register_buffer("table", torch.ones(1 << 27))\n',
    '        self.register_buffer("table", torch.ones(1 << 27))\n'
    '        self.register_buffer("scratch", torch.ones(1 << 26))\n')

HOG = SAME_SIZE.replace("    def forward(self, x):\n", "    def forward(self, x):\n"
                        "        self.hoard = [torch.ones(1 << 28) for _ in range(3)]  # 3 GiB more\n")


def test_owned_memory_leaves_out_reclaimable_page_cache():
    stat = "anon 300\nfile 1000\nshmem 200\nslab_reclaimable 50\nslab_unreclaimable 7\n"
    assert owned_from_stat(1600, stat) == 1600 - (1000 - 200) - 50
    assert owned_from_stat(1600, "") == 1600  # no breakdown: the whole charge
    assert owned_from_stat(100, "file 1000\n") == 0


def test_limit_grows_with_the_reference_and_never_below_the_floor():
    box = SandboxConfig(memory_bytes=1024 * MiB, memory_factor=2.0, memory_headroom_bytes=256 * MiB)
    assert candidate_limit(box, 100 * MiB) == 1024 * MiB
    assert candidate_limit(box, 2048 * MiB) == 2 * 2048 * MiB + 256 * MiB
    huge = candidate_limit(box, 10**15)  # never beyond what the reference's own side may hold
    assert huge == reference_limit(box)
    assert reference_limit(box) >= box.memory_bytes
    assert reference_limit(SandboxConfig(reference_memory_bytes=64 * GiB)) == 64 * GiB


def test_the_floor_never_passes_half_the_host():
    """On a 24 GiB host the 16 GiB floor let a candidate hold 14.5 GiB beside a compiler of 3 GiB."""
    half = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    box = SandboxConfig(memory_bytes=4 * half)
    assert candidate_limit(box, 0) == reference_limit(box) == half
    assert candidate_limit(SandboxConfig(memory_bytes=4 * half, reference_memory_bytes=3 * half), 0) == 3 * half


@pytest.fixture(scope="module")
def evaluator():
    timing = TimingConfig.quick()
    timing.max_time_s = 1.0
    config = EvalConfig(device="cpu", timing=timing, correctness_trials=2, call_timeout_s=30.0,
                        sandbox=SandboxConfig(memory_bytes=768 * MiB, memory_factor=2.0,
                                              memory_headroom_bytes=128 * MiB, max_processes=24))
    ev = Evaluator(Task(name="1_BigTable", level=1, source=REFERENCE), config)
    yield ev
    ev.close()


@pytest.mark.slow
def test_a_candidate_as_large_as_the_reference_passes_above_the_floor(evaluator):
    verdict = evaluator.evaluate(SAME_SIZE, remeasure=False)
    assert verdict.status == "ok", verdict.reasons
    memory = verdict.sandbox["memory"]
    assert memory["reference_peak_bytes"] > 600 * MiB
    assert memory["peak_bytes"] > 768 * MiB  # more than the floor: the old fixed limit refused it
    assert memory["limit_bytes"] == 2 * memory["reference_peak_bytes"] + 128 * MiB


@pytest.mark.slow
def test_a_candidate_far_larger_than_the_reference_is_stopped(evaluator):
    verdict = evaluator.evaluate(HOG, remeasure=False)
    assert verdict.status == "runtime_error"
    assert any("memory" in reason for reason in verdict.reasons), verdict.reasons


_HIDES = r'''
import mmap, os, sys
held = []
for _ in range(2):  # a shared anonymous region and a memfd whose descriptor is closed
    region = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_SHARED)
    held.append(region)
fd = os.memfd_create("hidden")
os.ftruncate(fd, 64 << 20)
held.append(mmap.mmap(fd, 64 << 20))
os.close(fd)
for region in held:
    for offset in range(0, 64 << 20, mmap.PAGESIZE):
        region[offset] = 1
    region.madvise(mmap.MADV_DONTNEED)  # out of the resident set; the pages stay while mapped
print("ready", flush=True)
sys.stdin.readline()
'''


def test_shared_memory_dropped_from_the_resident_set_is_still_counted():
    import subprocess
    import sys

    from cuda_l1.evaluate import side_memory

    proc = subprocess.Popen([sys.executable, "-c", _HIDES], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        held = side_memory.tree_bytes([proc.pid], None, "", "/nonexistent", None)
        objects = side_memory.unnamed_shared([proc.pid], None)
        assert sum(objects.values()) >= 192 * MiB, objects
        assert held >= 192 * MiB, held
        scan = side_memory.SharedScan(every_s=60)
        assert scan.objects([proc.pid], None) == objects and scan.objects([], None) == objects  # not scanned again
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
