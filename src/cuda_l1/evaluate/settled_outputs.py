"""Whether a candidate's outputs were finished inside its window (CUDA).

A window ends when the side replied and the parent's probe found the GPU idle. The probe sees work
that runs, not work that waits: on an H100 a matmul queued behind a long host-to-device copy, or behind
`cuStreamWaitValue32` on a word nobody wrote, left the probe finding an idle device in 0.3 ms
(`benchmarks/gpu_hypotheses/`, h1a and h1b). Work released later runs in time no side is charged for,
or inside the reference's window, which is then charged for it. So right after each candidate window
the reference's side reads a few positions of a few of its calls' outputs, drawn then, and at
verification reads them again: a position that changed was written after the window ended. (On a CPU
the doorbell holds each call's outputs to what they were at its ring: gating.py.)
"""

from __future__ import annotations

import dataclasses
import random

import torch

from cuda_l1.evaluate.verify import flat_storage, storage_positions

SPOTS = 16  # positions of each tensor output read per settled call


def draw_calls(calls: int, count: int, rng: random.Random) -> list[int]:
    """Which of a window's `calls` calls are read (up to `count`), drawn after the window."""
    return sorted(rng.sample(range(calls), min(count, calls)))


@dataclasses.dataclass
class Held:
    """What one output held at a few positions right after its window."""

    call: int  # the call's index in its window
    output: int  # the output's position among the call's outputs
    view: torch.Tensor  # the output, as the reader maps it
    positions: torch.Tensor  # element offsets in its storage
    values: torch.Tensor  # what they held (a copy)


def take(outputs: list[tuple[int, list[torch.Tensor | None], random.Random]], spots: int = SPOTS) -> list[Held]:
    """Reads `spots` positions of every tensor of each (call, outputs, rng), drawn from its rng, and keeps
    them. The positions of all outputs go to the device in one copy (each copy is a synchronisation)."""
    drawn = []
    for call, tensors, rng in outputs:
        for pos, t in enumerate(tensors):
            if t is not None and t.numel():
                drawn.append((call, pos, t, storage_positions(t, [rng.randrange(t.numel()) for _ in range(spots)])))
    if not drawn:
        return []
    every = torch.tensor([p for *_, positions in drawn for p in positions], dtype=torch.int64).to(drawn[0][2].device)
    held = []
    for n, (call, pos, t, positions) in enumerate(drawn):
        index = every[n * spots:(n + 1) * spots].to(t.device)
        held.append(Held(call, pos, t, index, flat_storage(t)[index].clone()))
    return held


def changed(held: list[Held]) -> str:
    """The first output whose positions hold other bytes now than when they were taken ("" if none).
    Bytes, not values: a NaN is itself, and -0.0 is not 0.0."""
    if not held:
        return ""
    now = [flat_storage(h.view)[h.positions] for h in held]
    if torch.equal(torch.cat([n.view(torch.uint8).reshape(-1) for n in now]),
                   torch.cat([h.values.view(torch.uint8).reshape(-1) for h in held])):
        return ""
    for h, n in zip(held, now):
        differ = (n.view(torch.uint8).reshape(len(n), -1) != h.values.view(torch.uint8).reshape(len(n), -1)).any(1)
        count = int(differ.sum())
        if count:
            return (f"call {h.call + 1}, output {h.output}: {count} of {len(n)} positions read right after its "
                    "window held other values at verification (its work finished after the window, in time "
                    "no side was charged for)")
    return ""
