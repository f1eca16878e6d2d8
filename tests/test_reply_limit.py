"""A window's reply may take only the bytes its calls can (reply_limit.py), and a frame over that is
refused from its length header, before its body is read: the fat_reply candidate (a 61 MB reply)
is rejected in about the time it takes to write it, not after 15 s of parsing."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest

from corpus_util import cases
from cuda_l1.evaluate import reply_limit
from cuda_l1.evaluate.channel import Channel, ChannelError, new_key
from cuda_l1.evaluate.config import EvalConfig, SandboxConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.evaluate.protocol import MAX_CALLS, MAX_LEAVES, CallOutputs, LeafRef, Ran, encode


def _leaf(dims: int = 16, typename: str = "torch.Tensor", handle: str = "f" * 128) -> LeafRef:
    return LeafRef("tensor", typename, "complex128", [(1 << 40) - 1] * dims, [(1 << 48) - 1] * dims, (1 << 62) - 1,
                   (1 << 44) - 1, "cuda:7", (1 << 64) - 1, handle, (1 << 44) - 1)


def _frame_bytes(message) -> int:
    """Bytes of the body of the frame a side sends for `message` (its JSON header, as Channel.send
    writes it; no binary parts): what the limit is compared with."""
    return len(json.dumps(encode(message), separators=(",", ":"), allow_nan=True).encode())


def test_the_largest_honest_calls_fit():
    """The harness's widest tensor leaves (16 dimensions, every number at the protocol's limit, a type
    name of 200 characters, an IPC handle), nested in a structure, with a traceback-sized message."""
    leaves = [_leaf(typename="t" * 200) for _ in range(8)]
    structure = {"seq": "tuple", "items": [{"seq": "list", "items": ["tensor"]} for _ in leaves]}
    calls = [CallOutputs(structure, leaves) for _ in range(50)]
    signals = [f"torch.nn.functional.some_function_{i}" for i in range(20)]
    assert _frame_bytes(Ran(True, calls=calls, signals=signals)) <= reply_limit.reply_bytes(50, 8)
    # A forward that raised: its traceback (at most 6000 characters, here each escaped to 12 bytes).
    assert _frame_bytes(Ran(False, "\U0001F600" * 6000, signals=signals)) <= reply_limit.reply_bytes(0, 1)
    assert _frame_bytes(Ran(True, calls=[CallOutputs("tensor", [_leaf()])] * MAX_CALLS)) <= reply_limit.reply_bytes(MAX_CALLS, 1)


def test_the_limit_follows_what_was_asked():
    assert reply_limit.reply_bytes(0, 1) == reply_limit.MESSAGE_BYTES
    one, many = reply_limit.reply_bytes(1, 1), reply_limit.reply_bytes(256, 1)
    assert one < many < 2 << 20  # the fat reply's window: 256 calls of one output, 61 MB sent
    assert reply_limit.reply_bytes(256, 4) > many
    # Before the reference has described a call: the protocol's limit on outputs, never past the load limit.
    assert reply_limit.reply_bytes(1, None) == reply_limit.reply_bytes(1, MAX_LEAVES)
    assert reply_limit.reply_bytes(MAX_CALLS, None) == reply_limit.LOAD_BYTES
    assert reply_limit.reference_leaves(None) is None
    assert reply_limit.reference_leaves(Ran(True)) is None
    assert reply_limit.reference_leaves(Ran(True, calls=[CallOutputs("tensor", [_leaf()] * 3)])) == 3


def test_an_oversized_frame_is_refused_from_its_header():
    """Only the frame's prefix is written (its body would be 60 MB): the channel refuses it at once
    instead of waiting to read the body."""
    read_fd, write_fd = os.pipe()
    try:
        chan = Channel(read_fd, write_fd, new_key(), is_parent=True)
        chan.max_frame_bytes = 1 << 20
        os.write(write_fd, struct.pack("<4sII", b"CL1F", 60 << 20, 0))
        started = time.monotonic()
        with pytest.raises(ChannelError, match="this message may take"):
            chan.recv_frame(timeout=10)
        assert time.monotonic() - started < 1.0
    finally:
        os.close(read_fd)
        os.close(write_fd)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="sandboxed sides (Linux)")
def test_fat_reply_is_rejected_from_its_size_quickly():
    case = {c.name: c for c in cases("cpu")}["fat_reply"]
    config = EvalConfig(device="cpu", timing=TimingConfig.quick(), call_timeout_s=15.0, first_call_timeout_s=30.0,
                        sandbox=SandboxConfig(memory_bytes=3 * 2**30, max_processes=24))
    evaluator = Evaluator(case.task(), config)
    try:
        verdict = evaluator.evaluate(case.source())
    finally:
        evaluator.close()
    assert verdict.status == "rejected", (verdict.status, verdict.reasons)
    assert any("this message may take" in r for r in verdict.reasons), verdict.reasons
    assert "evaluator_error" not in verdict.timing
    # Read and parsed, the reply cost the parent 14-15 s of this phase on a 2-core host; refused from
    # its header, what remains is the side writing it (1.5-2.5 s there).
    assert verdict.timing["phases_s"]["windows"] < 7.0, verdict.timing["phases_s"]
