"""Judging one checked call: the child's report against the parent's own reference. Pure functions.

Every finding is (check name, status it implies, plain-words reason). The child's report is untrusted
data: sizes are validated, tensors rebuilt without pickle, and anything malformed is a rejection.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cuda_l1.evaluate.channel import ChannelError, Message, decode_tensor
from cuda_l1.evaluate.precision import Comparison, ToleranceConfig, compare
from cuda_l1.evaluate.verdict import INCORRECT, REJECTED


@dataclass
class Finding:
    check: str
    status: str
    reason: str


@dataclass
class CallJudgement:
    findings: list[Finding] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)

    def fail(self, check: str, status: str, reason: str) -> None:
        self.findings.append(Finding(check, status, reason))


def _short(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def judge_check(reply: Message, ref_structure, ref_leaves: list, oracle_leaves: list | None,
                parent_digest: str, tolerance: ToleranceConfig) -> CallJudgement:
    j = CallJudgement()
    h = reply.header
    if h.get("structure") != ref_structure:
        j.fail("output_structure", INCORRECT,
               f"forward returned {h.get('structure')!r}; the reference returns {ref_structure!r}")
        return j
    facts, metas = h.get("facts") or [], h.get("metas") or []
    if not (len(facts) == len(metas) == len(ref_leaves) == len(reply.blobs)):
        j.fail("output_structure", REJECTED, "the child's report does not match its own output count")
        return j

    if h.get("input_digest_before") != parent_digest:
        j.fail("input_provenance", REJECTED,
               "the inputs the candidate received differ from the reference's get_inputs() for this seed "
               "(input generation was tampered with)")
    elif h.get("input_digest_after") != h.get("input_digest_before"):
        j.fail("inputs_unchanged", REJECTED, "the candidate modified its input tensors")
    if h.get("earlier_output_changed"):
        j.fail("output_ownership", REJECTED,
               "a tensor returned by an earlier call changed afterwards (outputs reuse a static buffer)")

    for index, (fact, meta, blob, ref) in enumerate(zip(facts, metas, reply.blobs, ref_leaves)):
        where = f"output {index}"
        if not isinstance(ref, torch.Tensor):
            if fact.get("value") != ref and not (isinstance(ref, float) and isinstance(fact.get("value"), (int, float))
                                                 and abs(fact["value"] - ref) <= 1e-6 * max(1.0, abs(ref))):
                j.fail("correctness", INCORRECT, f"{where}: {fact.get('value')!r} != reference {ref!r}")
            continue
        if "exact_tensor" not in fact:
            j.fail("output_type", INCORRECT, f"{where} is {fact.get('type')}, the reference returns a tensor")
            continue
        if not fact["exact_tensor"]:
            j.fail("output_type", REJECTED,
                   f"{where} is a {fact.get('type')} (a tensor subclass or deferred value), not a plain torch.Tensor")
            continue
        if fact.get("device", "").split(":")[0] == "meta":
            j.fail("output_type", REJECTED, f"{where} is a meta tensor with no values")
            continue
        if fact.get("aliases_input"):
            j.fail("no_input_aliasing", REJECTED, f"{where} shares memory with an input")
        if fact.get("reuses_earlier_output"):
            j.fail("output_ownership", REJECTED, f"{where} reuses the memory of an output returned earlier")
        ref_dtype = str(ref.dtype).replace("torch.", "")
        if fact.get("dtype") != ref_dtype:
            j.fail("dtype", INCORRECT, f"{where} has dtype {fact.get('dtype')}, the reference {ref_dtype}")
            continue
        if fact.get("shape") != list(ref.shape):
            j.fail("shape", INCORRECT, f"{where} has shape {fact.get('shape')}, the reference {list(ref.shape)}")
            continue
        if str(ref.device) != fact.get("device"):
            j.fail("device", INCORRECT, f"{where} is on {fact.get('device')}, the reference on {ref.device}")
            continue
        ref_stride = [s for s, n in zip(ref.stride(), ref.shape) if n > 1]
        cand_stride = [s for s, n in zip(fact.get("stride", []), fact.get("shape", [])) if n > 1]
        if ref_stride != cand_stride:
            j.fail("strides", INCORRECT, f"{where} has strides {fact.get('stride')}, the reference {list(ref.stride())}")
        try:
            cand = decode_tensor(meta, blob) if meta is not None else None
        except ChannelError as exc:
            j.fail("output_type", REJECTED, f"{where}: {exc}")
            continue
        if cand is None or list(cand.shape) != list(ref.shape):
            j.fail("output_type", REJECTED, f"{where}: reported values do not match the reported shape")
            continue
        oracle = oracle_leaves[index] if oracle_leaves is not None else None
        cmp = compare(cand, ref.detach().cpu(), oracle if isinstance(oracle, torch.Tensor) else None, tolerance)
        j.comparisons.append(cmp)
        if not cmp.ok:
            j.fail("correctness", INCORRECT, f"{where} ({_short(ref)}): {cmp.detail}")
    return j


def _beyond(got: torch.Tensor, expect: torch.Tensor, bound: float) -> float | None:
    """Largest difference if any element is further than `bound` from the reference (NaN matching NaN
    counts as equal), else None."""
    got, expect = got.double(), expect.double()
    diff = (got - expect).abs()
    diff[torch.isnan(got) & torch.isnan(expect)] = 0.0
    if torch.isnan(diff).any() or (diff > bound).any():
        return float(torch.nan_to_num(diff, nan=float("inf")).max())
    return None


def judge_spots(values: list, ref_leaves: list, positions: list, bound: float) -> str | None:
    """Spot values of one timed call against the reference output of the same round."""
    for index, (vals, ref, pos) in enumerate(zip(values, ref_leaves, positions)):
        if not isinstance(ref, torch.Tensor) or not pos:
            continue
        if not isinstance(vals, list) or len(vals) != len(pos):
            return f"output {index}: spot values missing"
        flat = ref.detach().reshape(-1)
        expect = flat[torch.tensor([p % flat.numel() for p in pos], device=flat.device)].cpu()
        worst = _beyond(torch.tensor([float(v) for v in vals], dtype=torch.float64), expect, bound)
        if worst is not None:
            return f"output {index}: a timed call's output differs from the reference by {worst:.3g} (allowed {bound:.3g})"
    return None


def judge_full(metas: list, blobs: list[bytes], ref_leaves: list, bound: float) -> tuple[str, str] | None:
    """A timed call's whole outputs against the reference output of the same round:
    (status, reason) when they are wrong, None when they hold."""
    if len(metas) != len(ref_leaves) or len(blobs) != len(ref_leaves):
        return REJECTED, "a timed call's outputs were reported inconsistently"
    for index, (meta, blob, ref) in enumerate(zip(metas, blobs, ref_leaves)):
        if not isinstance(ref, torch.Tensor):
            continue
        try:
            cand = decode_tensor(meta, blob) if meta else None
        except ChannelError:
            cand = None
        if cand is None or list(cand.shape) != list(ref.shape):
            return INCORRECT, f"output {index} of a timed call has the wrong shape or type"
        worst = _beyond(cand, ref.detach().cpu(), bound)
        if worst is not None:
            return INCORRECT, f"output {index} of a timed call differs from the reference by {worst:.3g} (allowed {bound:.3g})"
    return None
