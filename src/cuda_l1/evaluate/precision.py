"""Is a candidate's output right? The precision policy, decided in the trusted parent.

Default ("oracle"): the reference is also run in float64 on the same inputs. The candidate passes when
its largest error against that oracle is within `error_factor` times the reference's own largest error,
plus a floor of `floor_eps` machine epsilons of the output dtype scaled by the output's magnitude. So a
legitimate rewrite that only reorders floating-point operations passes (its error is of the same order
as the reference's), while computing an fp32 task in fp16, bf16 or TF32 fails (errors 100-10000x larger).
"kernelbench": KernelBench's fixed check, allclose(atol=1e-2, rtol=1e-2) against the reference, kept for
comparison with published numbers. NaN/Inf match only where the oracle (or the reference) has them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ToleranceConfig:
    """How close a candidate's outputs must be."""

    mode: str = "oracle"  # "oracle" (float64 reference, relative to the reference's own error) or "kernelbench"
    error_factor: float = 10.0  # candidate error may be this many times the reference's own error
    floor_eps: float = 64.0  # plus this many epsilons of the output dtype times max|oracle|
    kernelbench_atol: float = 1e-2  # KernelBench's absolute tolerance
    kernelbench_rtol: float = 1e-2  # KernelBench's relative tolerance


@dataclass
class Comparison:
    ok: bool
    detail: str
    candidate_error: float = 0.0
    allowed_error: float = 0.0
    reference_error: float = 0.0


def _special_masks(t: torch.Tensor):
    return torch.isnan(t), torch.isposinf(t), torch.isneginf(t)


def _same_specials(cand: torch.Tensor, *others: torch.Tensor) -> bool:
    c = _special_masks(cand)
    for other in others:
        if other is None:
            continue
        o = _special_masks(other)
        if all(torch.equal(a, b) for a, b in zip(c, o)):
            return True
    return False


def compare(cand: torch.Tensor, ref: torch.Tensor, oracle: torch.Tensor | None, config: ToleranceConfig) -> Comparison:
    """Compare one output leaf. All three tensors are CPU tensors of the same shape."""
    if cand.shape != ref.shape:
        return Comparison(False, f"shape {list(cand.shape)} != reference {list(ref.shape)}")
    if not (ref.is_floating_point() or ref.is_complex()):
        ok = torch.equal(cand.to(ref.dtype), ref)
        return Comparison(ok, "exact match" if ok else "integer/bool values differ from the reference")
    if cand.numel() == 0:
        return Comparison(True, "empty")

    c = cand.to(torch.complex128 if cand.is_complex() else torch.float64)
    r = ref.to(c.dtype)
    if config.mode == "kernelbench" or oracle is None:
        if not _same_specials(c, r):
            return Comparison(False, "NaN/Inf in different places than the reference")
        finite = torch.isfinite(c) & torch.isfinite(r)
        ok = torch.allclose(c[finite], r[finite], atol=config.kernelbench_atol, rtol=config.kernelbench_rtol)
        err = (c[finite] - r[finite]).abs().max().item() if finite.any() else 0.0
        label = "kernelbench tolerance" if config.mode == "kernelbench" else "no float64 oracle; kernelbench tolerance"
        return Comparison(bool(ok), f"max |cand-ref| {err:.3g} ({label})", err, float("nan"))

    o = oracle.to(c.dtype)
    if not _same_specials(c, o, r):
        n = int((~torch.isfinite(c)).sum())
        return Comparison(False, f"NaN/Inf where the float64 reference has none ({n} non-finite values)")
    finite = torch.isfinite(c) & torch.isfinite(o) & torch.isfinite(r)
    if not finite.any():
        return Comparison(True, "all values non-finite, matching the reference")
    cf, of, rf = c[finite], o[finite], r[finite]
    cand_err = (cf - of).abs().max().item()
    ref_err = (rf - of).abs().max().item()
    scale = of.abs().max().item()
    eps = torch.finfo(ref.dtype).eps if ref.is_floating_point() else torch.finfo(torch.float32).eps
    allowed = config.error_factor * ref_err + config.floor_eps * eps * max(scale, 1e-30)
    ok = cand_err <= allowed
    detail = (
        f"max error vs float64 {cand_err:.3g}, allowed {allowed:.3g} "
        f"(reference's own error {ref_err:.3g}, |output| up to {scale:.3g})"
    )
    return Comparison(ok, detail, cand_err, allowed, ref_err)


def spot_bound(comparisons: list[Comparison]) -> float:
    """Tolerance for spot checks of timed calls against the (non-oracle) reference output."""
    worst_allowed = max((c.allowed_error for c in comparisons), default=0.0)
    worst_ref = max((c.reference_error for c in comparisons if c.reference_error == c.reference_error), default=0.0)
    return 2.0 * (worst_allowed + worst_ref)
