"""One window of one side, on the parent's clock: its inputs written into its buffer, caches
flushed, the side resumed, its calls run, the side stopped and the device idle again. Every spare
and background side is stopped for it (side_supply.py). The referee (referee.py) decides which side
and how many calls; what the window measured goes into `side.window`, its reply into `side.ran`.

On a GPU the inputs are written inside the window, so that nothing a side left waiting for them (a
stream blocked on a word of its buffer, say) can run anywhere but in its own window; the flush then
comes before the write, and inputs may be found in the cache (alike for both sides). On a CPU the
first slot is written before the window and every later one inside it, after the call before it
has rung (gating.py): no call sees a later call's inputs. On a GPU every slot is written at the
window's start, so the first call could still see them all (docs/isolation.md).
"""

from __future__ import annotations

import time
from typing import Callable

from cuda_l1.evaluate import gating, reply_limit, timing
from cuda_l1.evaluate.protocol import BuildRequest, Run
from cuda_l1.evaluate.sandbox import ChildFailure
from cuda_l1.evaluate.sides import Side, as_ran, serve_build
from cuda_l1.evaluate.slots import RoundInputs
from cuda_l1.evaluate.verdict import REJECTED, TIMEOUT


def run(env, side: Side, slots: list[int], timeout: float, inputs: RoundInputs | None, count: int, *,
        first: bool, remaining: Callable[[], float], builds: list[dict]) -> None:
    """One window of `side` over `slots`, with the inputs of `count` slots written (`env`: the task's
    TaskEnv; `first`: the evaluation's first window, which may serve builds and is never recorded;
    `remaining`: seconds left of the evaluation, raising when none are; `builds`: where a build served
    in the window is recorded)."""
    gpu = env.device.startswith("cuda")
    # Settled first: the device done with what stopped spares and background sides left on it (a
    # TimeoutError lets the supply end the sides that keep it busy: side_supply.py).
    with env.supply.stopped(settle=lambda: env.quiet.wait_idle(min(timeout, 5.0))), \
            gating.wait_cores(None if gpu else env.core, env.config.busy_cores) as polls:
        _timed(env, side, slots, timeout, inputs, count, gpu, first, remaining, builds, polls)


def _timed(env, side: Side, slots: list[int], timeout: float, inputs: RoundInputs | None, count: int, gpu: bool,
           first: bool, remaining: Callable[[], float], builds: list[dict], polls: bool = True) -> None:
    proc, quiet = side.proc, env.quiet
    if not gpu:  # a stopped CPU side cannot react to the write: write, then flush, then time
        # Slot 0 only: every later slot is written when the call before it rang (gating.py).
        write_inputs(env, side, inputs, min(count, 1))
        write_slot = side.buffer.slot_writer(inputs) if inputs is not None else (lambda slot: None)
        # A null window (no slots) rings as often as a window of `count` calls: the same work per call.
        gate = gating.Gate(side, slots, len(slots) or count, write_slot, gating.spin_for(env.ref.window) if polls else 0.0)
    quiet.flush()
    t0 = time.perf_counter()
    if gpu:  # queued GPU work of a stopped side can: the write is part of the window
        write_inputs(env, side, inputs, count)
    if proc.chan.has_pending():
        # A window ends when its reply arrives: a frame sent ahead (during an earlier window, to
        # end this one at once) must not stand in for it.
        proc.kill("sent a message it was not asked for")
        raise ChildFailure(REJECTED, "the side sent a message before it was asked for one")
    # What the reply may take, known before it arrives: a larger frame is refused from its header.
    limit = (reply_limit.LOAD_BYTES if first
             else reply_limit.reply_bytes(len(slots), env.ref.leaves_per_call if env.ref else None))
    proc.thaw()
    t_sent = time.perf_counter()
    proc.send(Run(slots, first, go=0 if gpu else gate.base, rings=0 if gpu or slots else count, poll=polls,
                  shift=side.buffer.shift if side.buffer is not None else 0))
    receive = proc.recv_frame if gpu else gate.reply
    reply, msg = receive(min(timeout, remaining()), limit), None
    # A load_inline in the first forward is served as in a load (only the first window: not recorded).
    while first and isinstance(msg := proc.decode(reply), BuildRequest):
        serve_build(proc, msg, env.build, builds, remaining())
        reply = receive(min(timeout, remaining()), limit)
    t_reply = time.perf_counter()
    proc.freeze()
    t_frozen = time.perf_counter()
    try:
        quiet.wait_idle(min(timeout, remaining()))
    except TimeoutError:
        raise ChildFailure(TIMEOUT, "the device was still busy with the side's work long after its window") from None
    t_end = time.perf_counter()
    # Checking the reply is the parent's work, after the window: it costs about 7 us a call
    # described, and a candidate's descriptions (with IPC handles) are longer than the reference's.
    side.ran = as_ran(proc, msg if first else proc.decode(reply, max_calls=len(slots)))
    if slots and not first:
        side.harness_per_call.append(side.ran.harness_s / len(slots))
    side.leaves_per_call = reply_limit.reference_leaves(side.ran) or side.leaves_per_call
    if not gpu:
        gate.finish(side.ran, first)
        side.rungs = gate.rungs
    side.window = timing.Window(len(slots), t_end - t0, t_reply - t_sent, t_end - t_frozen, t_sent - t0)


def write_inputs(env, side: Side, inputs: RoundInputs | None, count: int) -> None:
    """The first `count` slots' inputs into the side's buffer (one copy when they come packed)."""
    if inputs is not None and inputs.packed is not None:
        side.buffer.write_packed(inputs.packed, count)
    else:
        for slot in range(count):
            side.buffer.write(slot, inputs[slot])
    env.sync()
