"""Which allocation an opened IPC handle is, told by its memory rather than by the string that named it.

A legacy CUDA IPC handle is 64 bytes of which the driver checks only some: on driver 580 an edited copy
of a handle (byte 63 changed; or bytes 40-43, which mapped the same memory again at another address)
opened the same allocation. A candidate could so name its input buffer, or one static buffer in every
call, under strings no string comparison matches. The verifier therefore records every allocation it
opens (with the input buffers it knows), and tells a new one apart from each known one of the same size
by writing through one mapping and reading through the other (`same_memory`), with the sides stopped.
The harness exports one handle per allocation (describe.py keeps them by the driver's buffer id), so an
honest side never names one allocation twice.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

IN_INPUT_BUFFER = "an output lies in "  # how a refusal for an input buffer begins (round_checks names its check by it)
MAX_PROBES = 4096  # write-and-read tests one verifier makes for one candidate; past it a new allocation is refused
PROBE_BYTES = 8


@dataclasses.dataclass
class Known:
    base: int  # where this process maps it
    size: int  # bytes of the allocation
    handle: str  # the string that named it ("" for memory this process holds itself)
    label: str  # what it is, for a reason ("" for a candidate's output)


def same_memory(view: Callable[[int, int], "object"], a: int, b: int) -> bool:
    """Whether mappings at `a` and `b` are one memory: the complement of what `b` holds is written at
    `a`, `b` is read back, `a` is restored. `view(address, nbytes)` gives a uint8 tensor there."""
    import torch

    at_a, at_b = view(a, PROBE_BYTES), view(b, PROBE_BYTES)
    saved = at_a.clone()
    mark = torch.bitwise_not(at_b)  # differs from b's bytes in every bit: only a shared write makes them equal
    at_a.copy_(mark)
    try:
        return bool(torch.equal(at_b, mark))
    finally:
        at_a.copy_(saved)
        if at_a.device.type == "cuda":
            torch.cuda.synchronize(at_a.device)


class Allocations:
    """The allocations one verifier has opened for one candidate, each known by its memory."""

    def __init__(self, view: Callable[[int, int], "object"], probe: Callable = same_memory):
        self.view, self.probe = view, probe
        self.known: list[Known] = []
        self.probes = 0

    def know(self, base: int, size: int, handle: str, label: str) -> None:
        """An allocation that is not an output (an input buffer), recorded without a test: it is what
        outputs are told apart from."""
        self.known.append(Known(base, size, handle, label))

    def admit(self, base: int, size: int, handle: str) -> str:
        """Records a newly opened output allocation; returns why it is refused ("" if it is not): it is
        an input buffer, or an allocation already named by another string."""
        for k in self.known:
            if k.size != size:
                continue
            if k.base != base:
                if self.probes >= MAX_PROBES:
                    return (f"more than {MAX_PROBES} tests were needed to tell this side's allocations apart "
                            "(too many of one size)")
                self.probes += 1
                if not self.probe(self.view, base, k.base):
                    continue
            if k.label:
                return f"{IN_INPUT_BUFFER}{k.label}, named by another IPC handle than the buffer's"
            return "one allocation was named by two IPC handles (the harness exports one per allocation)"
        self.known.append(Known(base, size, handle, ""))
        return ""
