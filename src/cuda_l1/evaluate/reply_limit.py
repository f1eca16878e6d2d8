"""How many bytes a window's reply may take, set before it is read.

A side's reply to a window describes each call the parent asked for. Read whole, a well-formed,
authenticated reply of 61 MB (4096 calls of 340 outputs, where 256 calls of one were asked for) cost
the parent 15 s and over a gigabyte (read, authenticated, parsed into millions of objects) before its
call count refused it. So the parent sets the most a reply may take from what it asked for: the
number of calls, times the most a call shaped like the reference's (its number of outputs) can take,
plus a constant for the rest of the message. The channel compares a frame's length header with that
limit before it reads the body (channel.Channel.recv_frame); a frame over it breaks the protocol and
the side is rejected at once.

The bounds are generous for what the harness writes (child.Side.describe: a tensor leaf is about 100
bytes, 1 KB at most with 16 dimensions, a 200-character type name and an IPC handle), so no honest
side comes near them; a candidate whose calls return many more outputs than the reference's (wrong
in any case) may meet them and is then rejected for its reply's size rather than judged incorrect."""

from __future__ import annotations

from cuda_l1.evaluate.protocol import MAX_LEAVES, Ran

LEAF_BYTES = 2048  # one output leaf as the harness writes it, with its item of the call's structure
CALL_BYTES = 512  # one call's own keys and the wrapper of its structure
# The rest of a Ran: its flags, a traceback (at most 6000 characters: 72 KB escaped at worst), up to
# 20 re-bound names.
MESSAGE_BYTES = 96 << 10
LOAD_BYTES = 64 << 20  # a message while loading or in the first window, which may be a build request (sources)


def reply_bytes(calls: int, leaves_per_call: int | None) -> int:
    """The most a reply to a window of `calls` calls may take, each returning `leaves_per_call`
    outputs (None: not known yet, the protocol's limit)."""
    leaves = MAX_LEAVES if leaves_per_call is None else min(leaves_per_call, MAX_LEAVES)
    return min(LOAD_BYTES, MESSAGE_BYTES + calls * (CALL_BYTES + leaves * LEAF_BYTES))


def reference_leaves(reference_ran: Ran | None) -> int | None:
    """Outputs per call in the reference's last reply (None when it described no call)."""
    if reference_ran is None or not reference_ran.calls:
        return None
    return len(reference_ran.calls[0].leaves)
