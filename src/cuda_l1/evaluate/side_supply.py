"""Fresh sides started ahead of time, shared by every evaluator of one worker.

A side process costs seconds before it can take work: the interpreter starts, torch is imported and,
on a GPU, the device context is created. Nothing of that depends on the task (the task arrives later,
with the side's Setup), so one worker keeps `spares` sides warming up while it evaluates, and hands
them to whichever task needs one next, as a candidate's side or as a new task's reference side. Every
side still serves one Setup only: a candidate always gets a brand-new process.

The supply is also where a worker's timed windows meet the work it does beside them (lookahead.py:
candidates loaded ahead in helper threads). Its `gate` is held by every timed window and by a helper
thread whenever it does anything but wait, and every side working in the background is stopped for
each window along with the warming spares: nothing of the worker runs beside a window, on the CPU
or on the GPU, and no helper thread holds the interpreter when a window's reply arrives.

A side is started under the settings its task will use (sandbox, device, readable paths, timing core):
a spare started under other settings is never handed out. Its memory limit is set when it is handed
out, from the task's reference (side_memory.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Callable

from cuda_l1.evaluate.sandbox import ChildFailure, SideProcess

# Seconds a new side may spend starting (interpreter, torch, the GPU context); spares younger than
# this that have not finished starting are stopped during every timed window, so their start never
# runs beside one.
WARMING_S = 20.0
# Seconds a side loading in the background (a candidate's, a new task's reference) may take to stop
# for a window before it is killed for it.
BACKGROUND_STOP_S = 10.0


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
        # Held by every timed window and by helper threads while they work (re-entrant: the thread
        # that times may also start sides).
        self.gate = threading.RLock()
        self._background: list[SideProcess] = []  # sides loading in helper threads
        self._stop_failures: dict[int, ChildFailure] = {}  # id(side) -> why it could not be stopped
        # Seconds the windows waited (stopped): for the gate, which a helper thread preparing the next
        # task holds while it works on the device, and for the device to go idle before the window.
        self.waited = {"gate": 0.0, "idle": 0.0}

    def prime(self, kind: SideKind, start: Callable[[int], SideProcess], memory_limit: int) -> None:
        """Start the spares before any task arrives (a worker's first task then finds them warming)."""
        with self.gate:
            while self.prewarm and len(self._ready) < self.spares:
                self._ready.append((kind, start(memory_limit)))

    def take(self, kind: SideKind, start: Callable[[int], SideProcess], memory_limit: int) -> SideProcess:
        """A fresh side of `kind` allowed `memory_limit` bytes: a spare if one is running, else a new
        one (`start(limit)`). Then spares are started for the next request."""
        with self.gate:
            return self._take(kind, start, memory_limit)

    def _take(self, kind: SideKind, start: Callable[[int], SideProcess], memory_limit: int) -> SideProcess:
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

    # -- sides working in the background (lookahead.py) ----------------------------------------------
    def track(self, side: SideProcess) -> None:
        """`side` works in a helper thread from now on: it is stopped for every window."""
        with self.gate:
            self._background.append(side)

    def untrack(self, side: SideProcess) -> ChildFailure | None:
        """`side` no longer works in the background; returns why it could not be stopped for a
        window, if that is how it ended (it was killed then: its helper sees only a closed channel)."""
        with self.gate:
            self._background = [p for p in self._background if p is not side]
            return self._stop_failures.pop(id(side), None)

    @contextlib.contextmanager
    def stopped(self, settle: Callable[[], None] | None = None):
        """The gate held and every warming spare and background side stopped for the block (a timed
        window); `settle` then runs first (wait until the device is idle: work they queued may still be
        running). A spare that cannot be stopped is closed: it was only ever a spare. A background side
        that cannot be stopped is killed, and its helper told why (untrack)."""
        asked = time.perf_counter()
        with self.gate:
            self.waited["gate"] += time.perf_counter() - asked
            held = []
            for spare in self.warming():
                try:
                    spare.freeze()
                    held.append(spare)
                except ChildFailure:
                    self._drop(spare)
            for side in [p for p in self._background if not p.frozen]:
                try:  # a candidate's load may be inside a long driver call: it gets longer to stop
                    side.freeze(timeout=BACKGROUND_STOP_S)
                    held.append(side)
                except ChildFailure as failure:
                    self._stop_failures[id(side)] = failure
            try:
                if held and settle is not None:
                    settling = time.perf_counter()
                    try:
                        self._settle(settle, held)
                    finally:
                        self.waited["idle"] += time.perf_counter() - settling
                yield
            finally:  # every side stopped here is resumed, whatever happened in the block
                for side in held:
                    try:
                        side.thaw()
                    except Exception as exc:  # noqa: BLE001 - one failure must not leave the rest stopped
                        failure = exc if isinstance(exc, ChildFailure) else ChildFailure(
                            "runtime_error", f"the side could not be resumed after a window: {exc}")
                        if any(p is side for p in self._background):
                            self._stop_failures.setdefault(id(side), failure)
                        else:
                            self._drop(side)

    def _settle(self, settle: Callable[[], None], held: list) -> None:
        """Let the device go idle before a window. Work a stopped side queued still runs; if it keeps
        the device busy past settle's limit, the background sides among them (candidates' code, not
        trusted) are ended for it, and the device is given one more chance; spares are trusted."""
        try:
            settle()
            return
        except TimeoutError:
            pass
        for side in [p for p in held if any(p is b for b in self._background)]:
            side.kill("kept the device busy while stopped")
            self._stop_failures[id(side)] = ChildFailure(
                "rejected", "the side kept the device busy while stopped, beside another candidate's window")
        try:
            settle()
        except TimeoutError:
            pass  # the window's own wait for an idle device charges what remains

    def _drop(self, spare: SideProcess) -> None:
        spare.close(graceful=False)
        self._ready = [(k, p) for k, p in self._ready if p is not spare]

    def close(self) -> None:
        with self.gate:
            for _, spare in self._ready:
                spare.close(graceful=False)
            self._ready = []
