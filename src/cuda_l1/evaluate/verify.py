"""Judging outputs read from outside: a candidate's call against the reference's call on the same inputs.

Pure functions over what the parent read (remote.py) and what the sides described (protocol.py).
Every finding is (check name, status it implies, plain-words reason).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

import torch

from cuda_l1.evaluate.output_memory import (MAX_LOOKS, MAX_PAIRS, MAX_TESTS, aliases, dense_layout, overlapping_outputs,
                                            placed, self_overlapping)
from cuda_l1.evaluate.precision import PROMOTES, Comparison, ToleranceConfig, compare, compared_exactly
from cuda_l1.evaluate.protocol import CallOutputs, LeafRef, LeafVerdict
from cuda_l1.evaluate.verdict import INCORRECT, REJECTED


NOTE = ""  # a finding's status when it is reported but does not decide the verdict


@dataclass
class Finding:
    check: str
    status: str  # the status it implies, or NOTE
    reason: str


def _short(ref: LeafRef) -> str:
    return f"{ref.dtype}{ref.shape}"


def describe_mismatch(cand: CallOutputs, ref: CallOutputs) -> list[Finding]:
    """Structure, types, dtypes, shapes, devices and strides: everything but the values."""
    if cand.structure != ref.structure:
        return [Finding("output_structure", INCORRECT,
                        f"forward returned {cand.structure!r}; the reference returns {ref.structure!r}")]
    if len(cand.leaves) != len(ref.leaves):
        return [Finding("output_structure", REJECTED, "the side's description does not match its own structure")]
    found = []
    for index, (c, r) in enumerate(zip(cand.leaves, ref.leaves)):
        where = f"output {index}"
        if r.kind == "foreign":  # never compared, so never a pass (the task check refuses such outputs)
            found.append(Finding("correctness", INCORRECT, f"{where}: the reference's own output is a {r.type}, "
                                 "which cannot be compared"))
            continue
        if r.kind != "tensor":
            if c.kind != "value" or not _same_value(c.value, r.value):
                found.append(Finding("correctness", INCORRECT, f"{where}: {c.value!r} != reference {r.value!r}"))
            continue
        if c.kind == "foreign":
            found.append(Finding("output_type", REJECTED,
                                 f"{where} is a {c.type} (a tensor subclass, deferred or non-strided value, or a "
                                 "lazily conjugated or negated view), not a plain torch.Tensor"))
        elif c.kind != "tensor":
            found.append(Finding("output_type", INCORRECT, f"{where} is {c.type}, the reference returns a tensor"))
        elif c.dtype != r.dtype:
            found.append(Finding("dtype", INCORRECT, f"{where} has dtype {c.dtype}, the reference {r.dtype}"))
        elif c.shape != r.shape:
            found.append(Finding("shape", INCORRECT, f"{where} has shape {c.shape}, the reference {r.shape}"))
        elif c.device.split(":")[0] != r.device.split(":")[0]:
            found.append(Finding("device", INCORRECT, f"{where} is on {c.device}, the reference on {r.device}"))
        elif [s for s, n in zip(c.stride, c.shape) if n > 1] != [s for s, n in zip(r.stride, r.shape) if n > 1]:
            # Values are read and compared by logical position, whatever the layout: another order of a
            # dense layout (a transposed result) or a view with gaps (one column block of a fused
            # product's result) holds every value and is reported, not deciding. A broadcast or
            # overlapping view is not: it holds fewer values than the output has, so less work was done.
            overlapping = self_overlapping(c.shape, c.stride)
            kind = ("a broadcast or overlapping view" if overlapping else
                    "" if dense_layout(c.shape, c.stride) else "a view with gaps")
            found.append(Finding("strides", INCORRECT if overlapping else NOTE, f"{where} has strides {c.stride}, "
                                 f"the reference {r.stride}" + (f" ({kind})" if kind else "")))
    return found


def call_findings(cand: CallOutputs, ref: CallOutputs, input_handle: str,
                  input_ranges: list[tuple[int, int]]) -> list[Finding]:
    """What the parent sees of a checked call without reading it: its description against the
    reference's, and whether an output lies in the side's input buffer."""
    found = describe_mismatch(cand, ref)
    if any(aliases(leaf, input_handle, input_ranges) for leaf in cand.leaves):
        found.append(Finding("no_input_aliasing", REJECTED, "an output lies in the candidate's input buffer"))
    # Outputs of one call in one memory (two views of one buffer) where the reference's are apart:
    # less written than asked, and a caller changing one output would change the other. Only where the
    # reference's outputs carry their places (its side gives its own addresses, on a GPU too), and not
    # for a call its description already refused (each pair costs a solve). A reference whose own
    # outputs meet beyond what is tested (None) leaves nothing to hold a candidate to.
    if placed(ref) and not any(f.status in (INCORRECT, REJECTED) for f in found) \
            and (ref_pairs := overlapping_outputs(ref)) is not None:
        cand_pairs = overlapping_outputs(cand)
        if cand_pairs is None:
            found.append(Finding("output_ownership", INCORRECT, f"more of the call's outputs meet in memory than are "
                                 f"tested ({MAX_PAIRS} sharing, {MAX_TESTS} solved or {MAX_LOOKS} meeting pairs), "
                                 "where the reference's do not"))
        elif extra := sorted(cand_pairs - ref_pairs):
            first, second = extra[0]
            found.append(Finding("output_ownership", INCORRECT, f"outputs {first + 1} and {second + 1} of one call "
                                 "share memory, where the reference's are apart (changing one changes the other)"))
    return found


def _same_value(a, b) -> bool:
    """A scalar output against the reference's: equal, or a number within 1e-6 relative of a float (NaN
    matches NaN, an infinity itself). An int too large for a float differs: subtracting it raised
    OverflowError, and the parent's own failure left a wrong output unjudged."""
    if a == b:
        return True
    if any(isinstance(v, float) and math.isinf(v) for v in (a, b)):  # inf - 5.0 <= 1e-6 * inf held
        return False
    if isinstance(a, (int, float)) and isinstance(b, float) and not isinstance(a, bool):
        try:
            return abs(a - b) <= 1e-6 * max(1.0, abs(b)) or (a != a and b != b)
        except OverflowError:
            return False
    return False


def _beyond(got: torch.Tensor, expect: torch.Tensor, bound: float) -> float | None:
    """Largest difference if any element is further than `bound` from the reference (NaN matching NaN
    counts as equal), else None."""
    wide = torch.complex128 if got.is_complex() or expect.is_complex() else torch.float64
    if not got.numel():
        return None
    # The common case, in one pass and one synchronisation: nothing NaN (NaN propagates through the
    # maximum, and fails the comparison), nothing beyond the bound. A real `expect` is widened inside
    # the subtraction (type promotion), not copied first; complex values, float8 and bool are widened.
    if wide is torch.float64 and got.dtype in PROMOTES and expect.dtype in PROMOTES:
        lo, hi = torch.stack(torch.aminmax(got.to(wide) - expect)).tolist()
        if -lo <= bound and hi <= bound:
            return None
        got, expect = got.to(wide), expect.to(wide)
        diff = (got - expect).abs()
    else:
        got, expect = got.to(wide), expect.to(wide)
        diff = (got - expect).abs()
        if float(diff.amax()) <= bound:
            return None
    diff[torch.isnan(diff) & (torch.isnan(got) & torch.isnan(expect) | (got == expect))] = 0.0
    if torch.isnan(diff).any() or (diff > bound).any():
        return float(torch.nan_to_num(diff, nan=float("inf")).max())
    return None


def spot_values(cand: torch.Tensor, ref: torch.Tensor, count: int, rng: random.Random, bound: float) -> str | None:
    """`count` positions drawn now (after the window) compared between the two outputs."""
    return spots_at_once([(cand, ref, count, rng, bound)])[0]


def storage_positions(t: torch.Tensor, flat: list[int]) -> list[int]:
    """Element offsets in `t`'s storage of the row-major positions `flat` (any strides)."""
    out = []
    for p in flat:
        offset = t.storage_offset()
        for size, stride in zip(reversed(t.shape), reversed(t.stride())):
            p, i = divmod(p, size)
            offset += i * stride
        out.append(offset)
    return out


def flat_storage(t: torch.Tensor) -> torch.Tensor:
    return torch.as_strided(t, (t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)


def spots_at_once(items: list[tuple[torch.Tensor, torch.Tensor, int, random.Random, float]]) -> list[str | None]:
    """spot_values for many outputs (cand, ref, count, rng, bound) of one device with one copy of
    the positions to the device and one of the values back: on a GPU each copy is a synchronisation,
    and a checked output costs several of them when compared alone. Positions are drawn from each
    rng as spot_values draws them."""
    if not items:
        return []
    device = items[0][1].device
    exacts = [compared_exactly(ref) for _, ref, *_ in items]  # once per output: integers and bools
    draws, cand_pos, ref_pos = [], [], []
    for cand, ref, count, rng, _ in items:
        flat = [rng.randrange(ref.numel()) for _ in range(count)] if ref.numel() else []
        draws.append(len(flat))
        cand_pos += storage_positions(cand, flat)
        ref_pos += storage_positions(ref, flat)
    index = torch.tensor([cand_pos, ref_pos], dtype=torch.int64).to(device)
    gathered, start = [], 0
    for (cand, ref, *_), n, exact in zip(items, draws, exacts):
        if not n:  # nothing to look at (an empty output: its tensor may live on another device)
            continue
        wide = torch.complex128 if cand.is_complex() or ref.is_complex() else torch.float64
        picks = [index[0, start:start + n], index[1, start:start + n]]
        if exact:  # int64 in float64 loses values past 2**53: its two 32-bit halves, each exact
            pair = torch.stack([flat_storage(t)[i.to(t.device)].to(device=device, dtype=torch.int64)
                                for t, i in zip((cand, ref), picks)])
            gathered.append(torch.stack([pair >> 32, pair & 0xFFFFFFFF], dim=-1).reshape(2, -1).to(torch.float64))
            start += n
            continue
        pair = torch.stack([flat_storage(t)[i.to(t.device)].to(device=device, dtype=wide)
                            for t, i in zip((cand, ref), picks)])
        gathered.append(torch.view_as_real(pair).reshape(2, -1) if wide == torch.complex128 else pair)
        start += n
    values = torch.cat(gathered, dim=1).cpu() if gathered else None
    problems, start = [], 0
    for (cand, ref, _, _, bound), n, exact in zip(items, draws, exacts):
        if not n:
            problems.append(None)
            continue
        width = 2 * n if cand.is_complex() or ref.is_complex() or exact else n
        got, expect = values[0, start:start + width], values[1, start:start + width]
        start += width
        if exact:
            problems.append(None if torch.equal(got, expect) else
                            "differs from the reference at a checked position (integers, compared exactly)")
            continue
        if width != n:
            got, expect = torch.complex(got[0::2], got[1::2]), torch.complex(expect[0::2], expect[1::2])
        worst = _beyond(got, expect, bound)
        problems.append(None if worst is None else
                        f"differs from the reference by {worst:.3g} at a checked position (allowed {bound:.3g})")
    return problems


def full_values(cand: torch.Tensor, ref: torch.Tensor, bound: float,
                time_left: Callable[[], float] | None = None) -> str | None:
    step = 1 << 24
    c, r = cand.reshape(-1), ref.reshape(-1)
    for start in range(0, c.numel(), step):
        if time_left is not None:
            time_left()  # raises at the evaluation's deadline
        if compared_exactly(ref):
            if not torch.equal(c[start:start + step].to(r.dtype), r[start:start + step]):
                return "integer values differ from the reference (compared exactly)"
            continue
        worst = _beyond(c[start:start + step], r[start:start + step], bound)
        if worst is not None:
            return f"differs from the reference by {worst:.3g} (allowed {bound:.3g})"
    return None


def against_oracle(cand: torch.Tensor, ref: torch.Tensor, oracle: torch.Tensor | None,
                   tolerance: ToleranceConfig, time_left: Callable[[], float] | None = None) -> Comparison:
    return compare(cand, ref, oracle, tolerance, time_left)  # an oracle elsewhere is moved chunk by chunk


def spot_bound(comparisons: list[Comparison]) -> float:
    """Tolerance for comparing one output (one position of a call's outputs) against the reference's
    own output of the same inputs: what the full comparisons of that output allowed, plus the
    reference's own error (both sides err independently). Fixed by the tolerance policy and the
    reference, never by the candidate's error."""
    worst_allowed = max((c.allowed_error for c in comparisons if c.allowed_error == c.allowed_error), default=0.0)
    worst_ref = max((c.reference_error for c in comparisons if c.reference_error == c.reference_error), default=0.0)
    return 2.0 * (worst_allowed + worst_ref)


def judge_leaf(cand: torch.Tensor, ref: torch.Tensor, oracle: torch.Tensor | None, mode: str, bound: float | None,
               rng: random.Random, spots: int, tolerance: ToleranceConfig,
               time_left: Callable[[], float] | None = None) -> LeafVerdict:
    """One output leaf: in full against the float64 oracle (mode 'oracle', or while no bound is known
    yet), in full against the reference ('full'), or at `spots` positions drawn now ('spots').
    `time_left` raises at the evaluation's deadline, checked between chunks of a full comparison."""
    if mode == "oracle" or bound is None:
        cmp = against_oracle(cand, ref, oracle, tolerance, time_left)
        return LeafVerdict(cmp.ok, cmp.detail, compared=True, candidate_error=cmp.candidate_error,
                           allowed_error=cmp.allowed_error, reference_error=cmp.reference_error)
    problem = full_values(cand, ref, bound, time_left) if mode == "full" else spot_values(cand, ref, spots, rng, bound)
    return LeafVerdict(problem is None, problem or "")
