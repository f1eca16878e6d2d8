"""Which allocation an opened IPC handle is, told by its memory rather than by the string that named it.

A legacy CUDA IPC handle is 64 bytes of which the driver checks only some: on driver 580 an edited copy
of a handle (byte 63 changed; or bytes 40-43, which mapped the same memory again at another address)
opened the same allocation. A candidate could so name its input buffer, or one static buffer in every
call, under strings no string comparison matches. The verifier therefore records every allocation it
opens (with the input buffers it knows), and tells a new one apart from both input buffers and from
each known one of the same size by writing a random mark through one mapping and reading the others (`same_memory`), with the sides
stopped. Verification compares what it read right after the window with the same positions at its end
(settled_outputs.py), so work this write might release is seen.
The harness exports one handle per allocation (describe.py keeps them by the driver's buffer id), so an
honest side never names one allocation twice.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Callable

IN_INPUT_BUFFER = "an output lies in "  # how a refusal for an input buffer begins (round_checks names its check by it)
MAX_KNOWN = 4096  # allocations one verifier tells apart for one candidate; past it a new one is refused
PROBE_BYTES = 8


@dataclasses.dataclass
class Known:
    base: int  # where this process maps it
    size: int  # bytes of the allocation, as the driver reports them for this mapping
    handle: str  # the string that named it ("" for memory this process holds itself)
    label: str  # what it is, for a reason ("" for a candidate's output)


def same_memory(view: Callable[[int, int], "object"], a: int, bases: list[int]) -> int | None:
    """Which of the mappings at `bases` is the memory mapped at `a` (its index), if any: a random mark is
    written at `a`, every base is read in one gather, `a` is restored. `view(address, nbytes)` gives a
    uint8 tensor there. The mark is drawn now, so no other memory can hold it but by a 2**-64 chance."""
    import torch

    at_a = view(a, PROBE_BYTES)
    saved = at_a.clone()
    mark = torch.tensor(list(secrets.token_bytes(PROBE_BYTES)), dtype=torch.uint8).to(at_a.device)
    at_a.copy_(mark)
    try:
        seen = torch.stack([view(b, PROBE_BYTES) for b in bases])
        hits = (seen == mark).all(dim=1).nonzero()
        return int(hits[0, 0]) if len(hits) else None
    finally:
        at_a.copy_(saved)
        if at_a.device.type == "cuda":
            torch.cuda.synchronize(at_a.device)


class Allocations:
    """The allocations one verifier has opened for one candidate, each known by its memory."""

    def __init__(self, view: Callable[[int, int], "object"], probe: Callable = same_memory):
        self.view, self.probe = view, probe
        self.known: list[Known] = []

    def know(self, base: int, size: int, handle: str, label: str) -> None:
        """An allocation that is not an output (an input buffer), recorded without a test: it is what
        outputs are told apart from."""
        self.known.append(Known(base, size, handle, label))

    def admit(self, base: int, size: int, handle: str) -> str:
        """Records a newly opened output allocation; returns why it is refused ("" if it is not): it is
        an input buffer, or an allocation already named by another string. Input buffers are tested
        whatever size this mapping reports; other outputs' allocations, where the sizes agree (one
        allocation reports one size). One write and one gather, however many are known."""
        if len(self.known) >= MAX_KNOWN:
            return f"more than {MAX_KNOWN} allocations of the candidate's were opened (too many to tell apart)"
        hit = next((k for k in self.known if k.base == base), None)
        if hit is None:
            targets = [k for k in self.known if k.label or k.size == size]
            index = self.probe(self.view, base, [k.base for k in targets]) if targets else None
            hit = targets[index] if index is not None else None
        if hit is not None:
            if hit.label:
                return f"{IN_INPUT_BUFFER}{hit.label}, named by another IPC handle than the buffer's"
            return "one allocation was named by two IPC handles (the harness exports one per allocation)"
        self.known.append(Known(base, size, handle, ""))
        return ""
