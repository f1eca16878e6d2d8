"""Fresh sides started ahead of time, shared by every evaluator of one worker.

A side process costs seconds before it can take work: the interpreter starts, torch is imported and,
on a GPU, the device context is created. Nothing of that depends on the task (the task arrives later,
with the side's Setup), so one worker keeps `spares` sides warming up while it evaluates, and hands
them to whichever task needs one next, as a candidate's side or as a new task's reference side. Every
side still serves one Setup only: a candidate always gets a brand-new process.

A side is started under the settings its task will use (sandbox, device, readable paths, timing core):
a spare started under other settings is never handed out. Its memory limit is set when it is handed
out, from the task's reference (side_memory.py).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from cuda_l1.evaluate.sandbox import SideProcess


@dataclasses.dataclass(frozen=True)
class SideKind:
    """How a side is started; two sides of one kind can serve each other's purpose."""

    sandbox: str  # repr of the SandboxConfig
    device: str
    read_paths: tuple[str, ...]
    core: int | None


class SideSupply:
    """Hands out fresh sides; with `prewarm`, keeps `spares` of the last kind asked for warming up."""

    def __init__(self, prewarm: bool, spares: int = 2):
        self.prewarm = prewarm
        self.spares = max(1, spares)
        self._ready: list[tuple[SideKind, SideProcess]] = []
        self.handed_out = 0  # sides given to evaluations
        self.warm_handed_out = 0  # of them, ones started ahead

    def take(self, kind: SideKind, start: Callable[[int], SideProcess], memory_limit: int) -> SideProcess:
        """A fresh side of `kind` allowed `memory_limit` bytes: a spare if one is running, else a new
        one (`start(limit)`). Then spares are started for the next request."""
        child = None
        keep: list[tuple[SideKind, SideProcess]] = []
        for spare_kind, spare in self._ready:
            usable = spare_kind == kind and spare.exit_info().reason == "running"
            if child is None and usable and spare.set_memory_limit(memory_limit):
                child = spare
            elif usable:
                keep.append((spare_kind, spare))
            else:  # dead, or started under settings no task of this worker uses now
                spare.close(graceful=False)
        self._ready = keep
        self.handed_out += 1
        if child is None:
            child = start(memory_limit)
        else:
            self.warm_handed_out += 1
        if self.prewarm:
            while len(self._ready) < self.spares:
                self._ready.append((kind, start(memory_limit)))
        return child

    def close(self) -> None:
        for _, spare in self._ready:
            spare.close(graceful=False)
        self._ready = []
