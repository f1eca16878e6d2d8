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

import contextlib
import dataclasses
import time
from typing import Callable

from cuda_l1.evaluate.sandbox import ChildFailure, SideProcess

# Seconds a new side may spend starting (interpreter, torch, the GPU context); spares younger than
# this that have not finished starting are stopped during every timed window, so their start never
# runs beside one.
WARMING_S = 20.0


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

    def warming(self) -> list[SideProcess]:
        """Spares still starting (and so maybe busy on the CPU or the GPU). A spare that is done
        starting waits, blocked, for its Setup: stopping it around every window would only cost time."""
        now = time.monotonic()
        return [p for _, p in self._ready if now - p.started_at < WARMING_S and not p.started()]

    @contextlib.contextmanager
    def stopped(self, settle: Callable[[], None] | None = None):
        """Every warming spare stopped for the block (a timed window); `settle` then runs first (wait
        until the device is idle: work a spare queued may still be running). A spare that cannot be
        stopped is closed: it was only ever a spare."""
        held = []
        for spare in self.warming():
            try:
                spare.freeze()
                held.append(spare)
            except ChildFailure:
                self._drop(spare)
        if held and settle is not None:
            settle()
        try:
            yield
        finally:
            for spare in held:
                try:
                    spare.thaw()
                except ChildFailure:
                    self._drop(spare)

    def _drop(self, spare: SideProcess) -> None:
        spare.close(graceful=False)
        self._ready = [(k, p) for k, p in self._ready if p is not spare]

    def close(self) -> None:
        for _, spare in self._ready:
            spare.close(graceful=False)
        self._ready = []
