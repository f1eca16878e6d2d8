"""Whether a reference gives the same outputs for the same inputs: a sample of one call's outputs
against a second call's.

A reference that draws random numbers in its forward (dropout in train mode) cannot be matched: each
call, the float64 oracle's included, draws its own, so the reference's own error against the oracle
is about as large as its outputs, and the allowance scaled by it let a candidate skipping the
dropout, in bf16, even 40% off everywhere, pass at 2.3x while the reference itself as a candidate
was `incorrect`. Such a task is refused before any candidate is judged (its outputs for the same
inputs differ). One whose random draws do not reach its outputs (KernelBench's dropout before a
mean over a softmax, say) passes.

A sample, not the outputs: a large output held twice would double what the reference's first run
needs, and a random mask shows at most positions. A GPU's order of floating-point additions may
differ between calls (atomics): differences below RELATIVE of the output's largest sampled value
are that, not randomness.
"""

from __future__ import annotations

SAMPLE = 4096  # positions sampled per output
RELATIVE = 1e-3  # of the largest sampled |value|: what two calls may differ by (a GPU's summation order)


def output_sample(leaves: list) -> list:
    """For each output leaf: a tensor's dtype, shape and values at up to SAMPLE positions spread over
    it (on the CPU), or a scalar as it is."""
    import torch

    sample = []
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            sample.append(leaf)
            continue
        n = leaf.numel()
        if n == 0:
            sample.append((leaf.dtype, tuple(leaf.shape), None))
            continue
        flat = torch.linspace(0, n - 1, min(n, SAMPLE), dtype=torch.float64).round().long().unique()
        where = torch.unravel_index(flat.to(leaf.device), leaf.shape) if leaf.dim() else ()
        sample.append((leaf.dtype, tuple(leaf.shape), leaf[where].detach().cpu().clone()))
    return sample


def first_difference(first: list, second: list) -> str | None:
    """Where two calls' samples differ beyond a GPU's summation order (None: nowhere), in words."""
    import torch

    if len(first) != len(second):
        return f"{len(first)} outputs, then {len(second)}"
    for index, (a, b) in enumerate(zip(first, second)):
        if not isinstance(a, tuple) or not isinstance(b, tuple):
            if a != b and not (a != a and b != b):  # NaN equals NaN here
                return f"output {index} was {a!r}, then {b!r}"
            continue
        if a[:2] != b[:2]:
            return f"output {index} was {a[1]} {a[0]}, then {b[1]} {b[0]}"
        if a[2] is None:
            continue
        x, y = a[2], b[2]
        if x.dtype.is_floating_point or x.dtype.is_complex:
            wide = torch.complex128 if x.dtype.is_complex else torch.float64
            x, y = x.to(wide), y.to(wide)
            same_nan = torch.isnan(x) & torch.isnan(y)
            both_inf = torch.isinf(x) & (x == y)
            diff = torch.where(same_nan | both_inf, 0.0, (x - y).abs())
            finite = torch.where(torch.isfinite(x), x.abs(), 0.0)
            scale = float(finite.max()) if finite.numel() else 0.0
            worst = float(torch.nan_to_num(diff, nan=float("inf")).max())
            if worst > RELATIVE * scale:
                share = float((diff > RELATIVE * scale).double().mean())
                return (f"output {index} differs at {share:.0%} of {x.numel()} sampled positions, by up to "
                        f"{worst:.3g} (its values reach {scale:.3g})")
        elif not torch.equal(x, y):
            return f"output {index} differs at {int((x != y).sum())} of {x.numel()} sampled positions"
    return None


_DIGEST_CHUNK = 1 << 24  # words a pass of input_digest holds in int64 at once (128 MiB)


def input_digest(values: list) -> list:
    """Per input: a tensor's dtype, shape and a digest of its bytes (on a CPU their CRC-32; on a device
    two exact sums of them as 32-bit words, plain and weighted by position, so that a permutation
    changes the second: word_sums); a scalar as it is. Two digests differ wherever the forward wrote
    its inputs, however little (a sample within a tolerance missed an x.add_(1e-4), and every candidate
    was then charged with the reference's fault). A tensor whose bytes cannot be viewed is sampled."""
    import zlib

    import torch

    digest = []
    for v in values:
        if not isinstance(v, torch.Tensor):
            digest.append(v)
            continue
        try:
            flat = v.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
            bytes_digest = zlib.crc32(flat.numpy()) if flat.device.type == "cpu" else word_sums(flat)
        except Exception:  # noqa: BLE001 - a layout or dtype with no bytes to view: its sample's values
            try:
                bytes_digest = repr(output_sample([v])[0][2].tolist())
            except Exception:  # noqa: BLE001 - nothing to digest: not checked here (the referee checks every round)
                bytes_digest = None
        digest.append((str(v.dtype), tuple(v.shape), bytes_digest))
    return digest


def word_sums(flat) -> tuple[int, int]:
    """Two exact sums of a byte tensor as 32-bit words (as bytes where its length is no multiple of 4),
    plain and weighted by position, where it lies, _DIGEST_CHUNK words at a time (int64 wraps alike on
    every device)."""
    import torch

    words = flat.view(torch.int32) if flat.numel() % 4 == 0 else flat
    plain = weighted = 0
    for start in range(0, words.numel(), _DIGEST_CHUNK):
        chunk = words[start:start + _DIGEST_CHUNK].to(torch.int64)
        place = torch.arange(start + 1, start + 1 + chunk.numel(), device=chunk.device, dtype=torch.int64)
        plain += int(chunk.sum())
        weighted += int((chunk * place).sum())
    return plain, weighted
