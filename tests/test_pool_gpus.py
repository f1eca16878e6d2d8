"""The local pool on a host with two or more GPUs: a suspicious speedup (the re-measure rule, above 3x)
measured on one GPU is confirmed on another, and both measurements are kept in the verdict.

Marked `gpu`; skipped with fewer than two GPUs. With $CUDA_L1_RESULTS_DIR set, the verdicts (both
speedups, the devices, where the confirmation ran), GPU names, versions and date are written to
remeasure_two_gpus.json there.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.jobs import EvalJob
from cuda_l1.evaluate.local_pool import LocalPool, visible_gpus
from cuda_l1.evaluate.verdict import OK
from cuda_l1.tasks import make_task

pytestmark = pytest.mark.gpu

# (x @ A) @ B on a tall x costs ROWS*DIM*DIM; x @ (A @ B) about DIM/OUT times less: far above 3x.
CHAIN_TASK = '''
import torch
import torch.nn as nn

ROWS = 32768
DIM = 1024
OUT = 8


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(DIM, DIM) / DIM ** 0.5)
        self.b = nn.Parameter(torch.randn(DIM, OUT) / DIM ** 0.5)

    def forward(self, x):
        return (x @ self.a) @ self.b


def get_inputs():
    return [torch.randn(ROWS, DIM)]


def get_init_inputs():
    return []
'''

CHAIN_FAST = '''
import torch
import torch.nn as nn

DIM = 1024
OUT = 8


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(DIM, DIM) / DIM ** 0.5)
        self.b = nn.Parameter(torch.randn(DIM, OUT) / DIM ** 0.5)

    def forward(self, x):
        return x @ (self.a @ self.b)
'''


def test_a_suspicious_speedup_is_confirmed_on_another_gpu():
    if visible_gpus() < 2:
        pytest.skip("needs two GPUs")
    import torch

    task = make_task(CHAIN_TASK, name="chain", level=1, origin="test:chain")
    config = EvalConfig(device="cuda", timing=TimingConfig.quick())
    started = time.monotonic()
    with LocalPool("cuda", config, workers=2) as pool:
        assert pool.remeasure_elsewhere and len(set(pool.workers)) == 2
        results = list(pool.run([EvalJob(task, CHAIN_FAST, key="fast"),
                                 EvalJob(task, CHAIN_FAST + "\n# the same program again\n", key="twin")]))
    wall = time.monotonic() - started
    records = []
    for result in results:
        verdict = result.verdict
        assert verdict.status == OK, verdict.reasons
        again = verdict.timing["remeasured"]
        assert again["where"].startswith("another GPU"), again["where"]
        assert verdict.speedup > 3.0 and verdict.speedup <= again["speedup"]  # the lower of the two counts
        records.append({"key": result.job.key, "worker": result.worker, "speedup": verdict.speedup,
                        "raw_speedup": verdict.raw_speedup, "ci": verdict.ci, "remeasured": again})
    out_dir = os.environ.get("CUDA_L1_RESULTS_DIR")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        record = {"test": "test_a_suspicious_speedup_is_confirmed_on_another_gpu",
                  "command": "pytest -m gpu tests/test_pool_gpus.py",
                  "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "gpus": [torch.cuda.get_device_name(i) for i in range(visible_gpus())],
                  "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
                  "wall_s": wall, "verdicts": records}
        (Path(out_dir) / "remeasure_two_gpus.json").write_text(json.dumps(record, indent=2, default=str))
