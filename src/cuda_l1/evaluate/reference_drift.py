"""Whether a verdict's reference timing came from a normal measurement window.

Speedups come from the paired rounds, where reference and candidate share one window; the medians
of the reference kept from earlier correct verdicts (same task, device and software) are the
yardstick that tells whether that window was a normal one. Deciding that is a judgement about
measurements, so it lives here; the store only keeps the medians and hands them over.
"""

from __future__ import annotations

from cuda_l1.evaluate.verdict import Check

REFERENCE_DRIFT_LIMIT = 0.10  # a reference median this far from the stored one flags the verdict


def reference_stable(reference_ms: float, stored: dict) -> Check:
    """The non-blocking `reference_stable` check for a verdict whose reference median is `reference_ms`.

    stored: what the store keeps for the task, device and software ({"median_ms", "samples_ms"}),
    {} when nothing is kept yet; with no earlier samples this median becomes the yardstick.
    """
    samples = list(stored.get("samples_ms") or [])
    if not samples:
        return Check("reference_stable", None, "first reference timing for this task, device and software: "
                     f"{reference_ms:.4g} ms, kept as the yardstick", blocking=False)
    drift = reference_ms / stored["median_ms"] - 1.0
    stable = abs(drift) <= REFERENCE_DRIFT_LIMIT
    detail = (f"reference median {reference_ms:.4g} ms vs {stored['median_ms']:.4g} ms over "
              f"{len(samples)} earlier verdict(s) on this device and software ({drift:+.1%})")
    if not stable:
        detail += ": the measurement window was disturbed (clocks, heat or other work on the device)"
    return Check("reference_stable", stable, detail, blocking=False)
