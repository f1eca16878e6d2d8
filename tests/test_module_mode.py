"""The module mode: both models as constructed ("train", KernelBench's harness) or after model.eval()
("eval", CUDA-L1's harness, which published claims were measured with). A kernel that folds BatchNorm
into its weights is right in eval mode only; the audit judges a release in the mode it was measured in."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cuda_l1.errors import UserError
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import evaluate
from cuda_l1.evaluate.protocol import ProtocolError, Setup
from cuda_l1.evaluate.validate import decode
from cuda_l1.evaluate.verdict import INCORRECT, OK
from cuda_l1.tasks import make_task

REFERENCE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(32, 16)
        self.bn = nn.BatchNorm1d(16)

    def forward(self, x):
        return self.bn(self.linear(x))


def get_inputs():
    return [torch.randn(64, 32) * 3 + 1]


def get_init_inputs():
    return []
'''

# BatchNorm folded into the linear layer with its running statistics: inference semantics.
FOLDED = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(32, 16)
        self.bn = nn.BatchNorm1d(16)

    def forward(self, x):
        bn = self.bn
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        weight = self.linear.weight * scale[:, None]
        bias = (self.linear.bias - bn.running_mean) * scale + bn.bias
        return torch.nn.functional.linear(x, weight, bias)
'''


def _config(mode: str) -> EvalConfig:
    return EvalConfig(device="cpu", timing=TimingConfig(enabled=False), correctness_trials=2, module_mode=mode)


@pytest.mark.parametrize("mode, status", [("train", INCORRECT), ("eval", OK)])
def test_folded_batchnorm_is_right_in_eval_mode_only(mode, status):
    task = make_task(REFERENCE, name="linear_bn", level=1, origin="test")
    verdict = evaluate(task, FOLDED, _config(mode))
    assert verdict.status == status, verdict.reasons


def test_the_reference_runs_in_the_same_mode():
    """The unchanged reference is right in both modes: the mode is applied to both sides alike."""
    task = make_task(REFERENCE, name="linear_bn", level=1, origin="test")
    same = REFERENCE.replace("class Model(", "class ModelNew(")
    for mode in ("train", "eval"):
        verdict = evaluate(task, same, _config(mode))
        assert verdict.status == OK, (mode, verdict.reasons)


def test_the_mode_is_part_of_the_settings_key():
    train, evaluated = EvalConfig().config_key(), EvalConfig(module_mode="eval").config_key()
    assert train != evaluated
    assert "mode" not in train  # verdicts stored before the mode existed keep their key
    with pytest.raises(UserError, match="module_mode"):
        EvalConfig(module_mode="inference")


def test_a_setup_with_an_unknown_mode_is_refused():
    header = {**Setup("reference", "", "", "Model", 1, 1).__dict__, "mode": "inference"}
    with pytest.raises(ProtocolError, match="mode"):
        decode(header, from_side=False)
    header["mode"] = "eval"
    assert decode(header, from_side=False).mode == "eval"


def test_the_audit_judges_a_release_in_eval_mode_unless_told(tmp_path):
    """`cuda-l1 audit` runs both models in eval mode, as the release was measured; --module-mode train
    judges the same record as KernelBench's harness would (the folded BatchNorm then fails); --levels
    keeps the records of those levels only."""
    records = [{"level_id": 3, "task_id": 7, "ref_code": REFERENCE, "custom_code": FOLDED, "score_default": 1.0},
               {"level_id": 1, "task_id": 1, "ref_code": REFERENCE, "custom_code": None, "score_default": 2.0}]
    path = tmp_path / "solutions.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    outcomes = {}
    for mode in ("eval", "train"):
        out = tmp_path / mode
        args = ["--module-mode", "train"] if mode == "train" else []
        proc = subprocess.run([sys.executable, "-m", "cuda_l1", "audit", str(path), "--device", "cpu", "--quick",
                               "--levels", "3", "--out", str(out), "--json", *args],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        audit = json.loads((out / "audit.json").read_text())
        assert audit["module_mode"] == mode and [t["level"] for t in audit["tasks"]] == [3]
        outcomes[mode] = audit["tasks"][0]["outcome"]
    # Correct in eval mode: judged, whatever its speed (a call of this size can be at the harness floor
    # of a busy host, timing.HARNESS_FACTOR, and then its speedup is unmeasured).
    assert outcomes["eval"] in ("holds", "shrinks", "unmeasured") and outcomes["train"] == "fails", outcomes
