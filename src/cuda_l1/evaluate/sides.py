"""A side as the referee uses it, and the steps around a window: loading its module (with the
parent's builds) and checking, from outside, that it left its inputs alone."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

from cuda_l1.evaluate import timing
from cuda_l1.evaluate.protocol import BuildReply, BuildRequest, Confined, Loaded, Ran, Setup
from cuda_l1.evaluate.remote import RemoteMemory, input_mappings, inputs_unchanged
from cuda_l1.evaluate.sandbox import ChildFailure, SideProcess
from cuda_l1.evaluate.slots import SlotBuffer
from cuda_l1.evaluate.verdict import REJECTED, TIMEOUT


class ReferenceFailure(Exception):
    """The reference's own side failed (while a candidate was being judged, or while setting up)."""


@dataclass
class Side:
    """One side as the referee uses it: its process, its input buffer and a reader of its memory."""

    name: str  # "reference" | "candidate"
    proc: SideProcess
    buffer: SlotBuffer
    memory: RemoteMemory
    ran: Ran | None = None
    window: timing.Window | None = None
    input_ranges: list = field(default_factory=list)


MAX_BUILDS = 16  # extension builds one module may ask for


def load_side(proc: SideProcess, setup: Setup, timeout_s: float, build: Callable | None) -> tuple[Loaded, list[dict]]:
    """Send the setup and serve build requests until the side says whether its module loaded.
    Builds run in the parent's time: each is bounded by what is left of `timeout_s`, and there are at
    most MAX_BUILDS of them."""
    proc.send(setup)
    deadline = time.monotonic() + timeout_s
    builds, confined = [], False
    while True:
        msg = proc.recv(max(deadline - time.monotonic(), 0.01))
        if isinstance(msg, Confined) and not confined:
            # Only the report sent before the module was imported counts.
            confined = True
            proc.notes = dict(msg.sandbox)
        elif isinstance(msg, BuildRequest) and confined:
            started, left = time.monotonic(), deadline - time.monotonic()
            if left <= 1.0:
                raise ChildFailure(TIMEOUT, f"the module's extension builds took longer than its limit of {timeout_s:.0f} s")
            if len(builds) >= MAX_BUILDS:
                reply = {"ok": False, "log": f"more than {MAX_BUILDS} extension builds for one module"}
            elif build is None:
                reply = {"ok": False, "log": "no builder"}
            else:
                reply = build({"args": msg.args, "kwargs": msg.kwargs}, timeout_s=left)
                if reply.get("ok") and reply.get("so_path"):
                    reply = dict(reply, so_path=proc.receive_file(reply["so_path"]))
            builds.append({"ok": reply.get("ok"), "cached": reply.get("cached"), "seconds": round(time.monotonic() - started, 3)})
            proc.send(BuildReply(**{k: v for k, v in reply.items() if k in BuildReply.__dataclass_fields__ and v is not None}))
        elif isinstance(msg, Loaded) and confined:
            return msg, builds
        else:
            proc.kill("broke the protocol")
            raise ChildFailure(REJECTED, f"unexpected message {type(msg).__name__} while loading")


def mapped_inputs(side: Side) -> list[tuple[int, int]]:
    """Where a CPU side mapped its input buffer, as the kernel lists it (empty on CUDA)."""
    pid = side.proc.harness_pid()
    if side.proc.device != "cpu" or not pid or side.proc.inputs_fd < 0:
        return []
    st = os.fstat(side.proc.inputs_fd)
    ranges = input_mappings(pid, (st.st_dev, st.st_ino))
    if len(ranges) != 1:  # the buffer is mapped once, whole; anything else is not the harness's doing
        raise ChildFailure(REJECTED, "the side's input buffer is not mapped as the harness maps it")
    return ranges


def changed_inputs(side: Side, slots: list[int], pristine: list[list]) -> list[int]:
    """Slots whose inputs the side changed during its window. On CUDA the side maps the parent's own
    allocation, so the parent's view shows any write; on CPU the side's private mapping is read back."""
    if side.proc.device != "cpu":
        return [k for k in slots if not side.buffer.unchanged(k, pristine[k])]
    pid = side.proc.harness_pid()
    return [k for k in slots if pid is None or not inputs_unchanged(pid, side.input_ranges, side.buffer.leaf_ranges(k), pristine[k])]


def side_estimate(side: Side) -> float:
    """Seconds the side's last window took (0 before its first)."""
    return side.window.wall_s if side.window else 0.0
