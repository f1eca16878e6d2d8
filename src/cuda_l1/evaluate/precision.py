"""Is a candidate's output right? The precision policy, decided in the trusted parent.

Default ("oracle"): the reference is also run in float64 on the same inputs. The candidate passes when
its largest error against that oracle is within `error_factor` times the reference's own largest error,
plus a floor scaled by the output's magnitude: `floor_eps` epsilons of the output dtype, or of float32
for 16-bit outputs (whose epsilon is so large that 64 of them would be half the output: an output
scaled by 1.1 passed a bf16 task that way), and at least `low_precision_ulps` epsilons of the output
dtype (a 16-bit output cannot be asked to be exact to the float32 floor). A 16-bit output's errors,
the candidate's and the reference's, are taken against the oracle rounded to that dtype, so the
rounding every output has is not multiplied by `error_factor`. So a
legitimate rewrite that only reorders floating-point operations passes (its error is of the same order
as the reference's), while computing an fp32 task in fp16, bf16 or TF32 fails (errors 100-10000x larger).
"kernelbench": KernelBench's fixed check, allclose(atol=1e-2, rtol=1e-2) against the reference, kept for
comparison with published numbers. NaN/Inf match only where the oracle (or the reference) has them; where
only the oracle is finite, a candidate's finite value is held to it there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from cuda_l1.evaluate.tolerance import ToleranceConfig  # noqa: F401 - where callers have found it


@dataclass
class Comparison:
    ok: bool
    detail: str
    candidate_error: float = 0.0
    allowed_error: float = 0.0
    reference_error: float = 0.0


_CHUNK = 1 << 24  # elements compared at a time: float64 temporaries stay bounded for huge outputs
# Values grossly wrong where the reference is accurate. The allowance is one absolute bound scaled by
# max|output|, under which an output's small values are noise: a cumprod computing only the first 96
# of each row's ~140 normal values (zeros after) passed a KernelBench-shaped task, scored 1.26-1.38,
# each skipped value 100% wrong. So a value is also judged by itself where the reference got it within
# REFERENCE_WITHIN of float64 (no cancellation spoiled it there) and it is a normal number of the
# output's dtype: off by more than GROSS_RELATIVE of its size, it is grossly wrong, and an output with
# more than GROSS_SHARE of such values (and at least GROSS_MIN) fails. Honest variants stay below: a
# bf16 matmul whose split-K partial sums are rounded to bf16 has 0.13-0.31% (512 x 512, K 256-4096),
# another summation order in float32 none; approximations on wide inputs come nearer (tanh-GELU in
# bf16 on inputs of standard deviation 3 to 5: 2.7-3.8%); the truncated cumprod has 32%.
REFERENCE_WITHIN = 0.01
GROSS_RELATIVE = 0.5
GROSS_SHARE = 0.05
GROSS_MIN = 16
# dtypes that subtract from a float64 tensor by type promotion (float8 and bool refuse to): the
# comparisons widen other dtypes first
PROMOTES = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16})


def compared_exactly(t: torch.Tensor) -> bool:
    """Integer and bool outputs are compared exactly (as the oracle round does), never through float64."""
    return not (t.is_floating_point() or t.is_complex())


def _flat(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.reshape(-1)


def _specials(t: torch.Tensor) -> torch.Tensor:
    """0 finite, 1 NaN, 2 +inf, 3 -inf per element (for complex values, of both parts: 4x real + imag),
    so two patterns compare with torch.equal."""
    if t.is_complex():
        return 4 * _specials(t.real) + _specials(t.imag)
    return torch.isnan(t).to(torch.int8) + 2 * torch.isposinf(t).to(torch.int8) + 3 * torch.isneginf(t).to(torch.int8)


def compare(cand: torch.Tensor, ref: torch.Tensor, oracle: torch.Tensor | None, config: ToleranceConfig,
            time_left: Callable[[], float] | None = None) -> Comparison:
    """Compare one output leaf. The three tensors have the same shape; `cand` and `ref` sit on one
    device, and the oracle may sit elsewhere (the float64 oracle falls back to the CPU where the
    device has no room for it): it is brought over a chunk at a time, so that a 6 GiB float32
    output's 12 GiB oracle never needs a copy of its whole size on the device. `time_left` is called
    before each chunk and raises at the evaluation's deadline (a 32 GiB output kept the parent
    comparing for minutes past --timeout)."""
    if cand.shape != ref.shape:
        return Comparison(False, f"shape {list(cand.shape)} != reference {list(ref.shape)}")
    if compared_exactly(ref):
        ok = torch.equal(cand.to(ref.dtype), ref)
        return Comparison(ok, "exact match" if ok else "integer/bool values differ from the reference")
    if cand.numel() == 0:
        return Comparison(True, "empty")
    wide = torch.complex128 if cand.is_complex() or ref.is_complex() else torch.float64
    use_oracle = config.mode != "kernelbench" and oracle is not None
    # A 16-bit (or narrower) output is judged against the oracle rounded to its dtype: the rounding
    # itself (half an ulp, 0.4% of |output| for bf16) is error every output has, and ten times it
    # let an FP8 computation, or an output 3% off, pass a bf16 task.
    narrow = ref.is_floating_point() and ref.dtype.itemsize < 4
    c_all, r_all, o_all = _flat(cand), _flat(ref), _flat(oracle) if use_oracle else None
    cand_err = ref_err = scale = ref_scale = 0.0
    # Where the reference overflowed (or went NaN) and the float64 oracle did not, a candidate's
    # finite value there is judged against float64: within the rest of the output's allowance plus
    # the floor times that position's own |float64| (per position, so a huge value at one such
    # position loosens neither the others nor the rest). The other way round (float64 not finite,
    # the reference finite) the reference's value is rounding noise (a sum that cancels exactly in
    # float64): nothing to hold a candidate to there.
    lone_err = lone_excess = lone_scale = 0.0
    judged = gross = 0  # values judged by themselves, and those grossly wrong (GROSS_RELATIVE)
    tiny = torch.finfo(ref.dtype).tiny
    floor = floor_epsilons(ref.dtype, config)
    close, specials_ok, bad_specials, any_finite, any_lone = True, True, 0, False, False
    for start in range(0, c_all.numel(), _CHUNK):
        if time_left is not None:
            time_left()
        c = c_all[start:start + _CHUNK]
        r = r_all[start:start + _CHUNK]
        if not use_oracle or c.dtype not in PROMOTES or r.dtype not in PROMOTES:
            c, r = c.to(wide), r.to(wide)
        if not use_oracle:
            sc = _specials(c)
            if not torch.equal(sc, _specials(r)):
                specials_ok = False
                break
            finite = torch.isfinite(c) & torch.isfinite(r)
            if finite.any():
                cf, rf = c[finite], r[finite]
                close &= bool(torch.allclose(cf, rf, atol=config.kernelbench_atol, rtol=config.kernelbench_rtol))
                cand_err = max(cand_err, (cf - rf).abs().max().item())
                ref_scale = max(ref_scale, rf.abs().max().item())
            continue
        o = o_all[start:start + _CHUNK].to(device=c.device, dtype=wide)
        if narrow:
            rounded = o.to(ref.dtype).to(wide)
            o = torch.where(torch.isfinite(rounded), rounded, o)  # beyond the dtype's range: as is
        # All finite (nearly always): the same three maxima without masks, read in one synchronisation
        # (on a GPU each read is one; a chunk cost about ten before, most of a verification's time).
        errors = _finite_errors(c, o, r, tiny)
        if errors is not None:
            any_finite = True
            cand_err, ref_err, scale = max(cand_err, errors[0]), max(ref_err, errors[1]), max(scale, errors[2])
            judged, gross = judged + int(errors[3]), gross + int(errors[4])
            continue
        c, r = c.to(wide), r.to(wide)
        sc = _specials(c)
        if not (torch.equal(sc, _specials(o)) or torch.equal(sc, _specials(r))):
            specials_ok, bad_specials = False, bad_specials + int((~torch.isfinite(c)).sum())
            break
        both = torch.isfinite(c) & torch.isfinite(o)
        finite = both & torch.isfinite(r)
        if finite.any():
            any_finite = True
            cf, of, rf = c[finite], o[finite], r[finite]
            cand_err = max(cand_err, (cf - of).abs().max().item())
            ref_err = max(ref_err, (rf - of).abs().max().item())
            scale = max(scale, of.abs().max().item())
            counts = _gross_counts(cf - of, rf - of, of, tiny).tolist()
            judged, gross = judged + int(counts[0]), gross + int(counts[1])
        lone = both & ~torch.isfinite(r)
        if lone.any():
            any_lone = True
            diff, size = (c[lone] - o[lone]).abs(), o[lone].abs()
            lone_err, lone_scale = max(lone_err, diff.max().item()), max(lone_scale, size.max().item())
            lone_excess = max(lone_excess, (diff - floor * size).max().item())
    if not use_oracle:
        if not specials_ok:
            return Comparison(False, "NaN/Inf in different places than the reference")
        label = "kernelbench tolerance" if config.mode == "kernelbench" else "no float64 oracle; kernelbench tolerance"
        # What allclose lets through at the largest reference value: the bound later spot checks use,
        # fixed by the tolerance and the reference, never by the candidate's own error.
        allowed = config.kernelbench_atol + config.kernelbench_rtol * ref_scale
        return Comparison(bool(close), f"max |cand-ref| {cand_err:.3g} ({label})", cand_err, allowed)
    if not specials_ok:
        return Comparison(False, f"NaN/Inf where the float64 reference has none ({bad_specials} non-finite values)")
    against = f"float64 rounded to {str(ref.dtype).removeprefix('torch.')}" if narrow else "float64"
    allowed = config.error_factor * ref_err + floor * max(scale, 1e-30)
    if any_lone and not lone_excess <= allowed:
        return Comparison(False, f"where the reference is not finite and {against} is: max error {lone_err:.3g}, "
                          f"allowed {allowed:.3g} plus {floor:.3g} times each position's |{against}| "
                          f"(up to {lone_scale:.3g} there)", lone_err, allowed, ref_err)
    if not any_finite:
        return Comparison(True, "all values non-finite, matching the reference" if not any_lone
                          else f"every finite value is where only {against} is, each close to it")
    if gross > max(GROSS_MIN, GROSS_SHARE * judged):
        return Comparison(False, f"{gross} of the {judged} values the reference computes within "
                          f"{REFERENCE_WITHIN:.0%} of {against} are off by more than {GROSS_RELATIVE:.0%} of their "
                          f"size (more than {GROSS_SHARE:.0%} of them; max error {cand_err:.3g}, allowed {allowed:.3g} "
                          f"against max|output| {scale:.3g})", cand_err, allowed, ref_err)
    ok = cand_err <= allowed
    detail = (
        f"max error vs {against} {cand_err:.3g}, allowed {allowed:.3g} "
        f"(reference's own error {ref_err:.3g}, |output| up to {scale:.3g})"
    )
    return Comparison(ok, detail, cand_err, allowed, ref_err)


def _gross_counts(c_err: torch.Tensor, r_err: torch.Tensor, o: torch.Tensor, tiny: float) -> torch.Tensor:
    """[values judged by themselves, values grossly wrong] (REFERENCE_WITHIN, GROSS_RELATIVE) as a
    float64 tensor of two on the values' device, read with the other statistics. `c_err` and `r_err`
    are the candidate's and the reference's differences from `o`, taken once by the caller and
    overwritten here (their extremes are taken before)."""
    size = o.abs()
    judged = (r_err.abs_() if r_err.is_floating_point() else r_err.abs()) <= REFERENCE_WITHIN * size
    judged &= size >= tiny
    grossly = judged & ((c_err.abs_() if c_err.is_floating_point() else c_err.abs()) > GROSS_RELATIVE * size)
    return torch.stack([judged.sum(), grossly.sum()]).to(torch.float64)


def _finite_errors(c: torch.Tensor, o: torch.Tensor, r: torch.Tensor,
                   tiny: float) -> tuple[float, float, float, float, float] | None:
    """(max |c - o|, max |r - o|, max |o|, values judged by themselves, grossly wrong ones: _gross_counts)
    when every value of the three is finite, else None. `o` is
    the wide oracle; `c` and `r` come in their own dtypes. The differences are taken in the oracle's
    dtype by type promotion, with no widened copies of `c` and `r`, and each maximum is read from one
    pass over the extremes (aminmax). A NaN or an infinity anywhere makes an extreme non-finite (NaN
    propagates, and inf - inf is NaN), which is how one is found, so there are no isfinite passes.
    That is about a third of the memory traffic of widening, masking and reducing each separately,
    and all of it is read in one synchronisation (on a GPU each read is one)."""
    if o.is_complex():  # no extremes of complex values: widened, masked, as in the general path
        c, r = c.to(o.dtype), r.to(o.dtype)
        finite = torch.isfinite(c).all() & torch.isfinite(o).all() & torch.isfinite(r).all()
        real = torch.float64
        stats = torch.stack([finite.to(real), (c - o).abs().amax().to(real), (r - o).abs().amax().to(real),
                             o.abs().amax().to(real), *_gross_counts(c - o, r - o, o, tiny)]).tolist()
        return (stats[1], stats[2], stats[3], stats[4], stats[5]) if stats[0] else None
    c_err, r_err = c - o, r - o
    bounds = [*torch.aminmax(c_err), *torch.aminmax(r_err), *torch.aminmax(o)]  # before the counts overwrite them
    extremes = torch.stack([*bounds, *_gross_counts(c_err, r_err, o, tiny).to(o.dtype)]).tolist()
    if not all(math.isfinite(x) for x in extremes[:6]):
        return None
    c_lo, c_hi, r_lo, r_hi, o_lo, o_hi, judged, grossly = extremes
    return max(-c_lo, c_hi), max(-r_lo, r_hi), max(-o_lo, o_hi), judged, grossly


def floor_epsilons(dtype: torch.dtype, config: ToleranceConfig) -> float:
    """The floor of the allowed error, relative to max|oracle|, for outputs of `dtype`."""
    own = torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float32).eps
    wide = own if (not dtype.is_floating_point or dtype.itemsize >= 4) else torch.finfo(torch.float32).eps
    return max(config.floor_eps * wide, config.low_precision_ulps * own)

