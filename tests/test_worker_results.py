"""A worker's own pipe back to its pool (worker_results.py), with real spawned processes: messages
larger than the pipe arrive whole, in order, and a worker that dies halfway through one never stalls
the reader."""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
import time

import pytest

from cuda_l1.evaluate.worker_results import WorkerResults, send, wait_any

BIG = 5 << 20  # bytes: far more than a pipe holds, so the writer blocks until the reader drains it


def _send_three(writer) -> None:
    send(writer, ("first", None))
    send(writer, ("big", b"x" * BIG))
    send(writer, ("last", {"speedup": 1.5}))


def _die_mid_message(writer) -> None:
    send(writer, ("whole", 1))
    os.write(writer.fileno(), struct.pack("!Q", 1 << 20) + b"the start of a message")
    os._exit(3)


def _write_garbage(writer, kind: str) -> None:
    send(writer, ("whole", 1))
    if kind == "length":  # a length no message has
        os.write(writer.fileno(), struct.pack("!Q", 1 << 62))
    else:  # a whole frame that holds no pickle
        os.write(writer.fileno(), struct.pack("!Q", 5) + b"bogus")
    send(writer, ("after", 2))  # cannot be trusted to frame: never read
    time.sleep(30)  # alive: the reader must not wait for the pipe to end


def _worker(target, *args):
    """A spawned process writing to a new channel, as a pool starts its workers."""
    ctx = mp.get_context("spawn")
    results = WorkerResults(ctx)
    proc = ctx.Process(target=target, args=(results.writer, *args))
    proc.start()
    results.started()
    return results, proc


def _collect(results: WorkerResults, proc, limit_s: float = 60.0) -> list:
    messages, deadline = [], time.monotonic() + limit_s
    while not results.ended and time.monotonic() < deadline:
        wait_any([results], timeout=0.2)
        messages += results.receive()
    proc.join(timeout=10)
    return messages


def test_messages_larger_than_the_pipe_arrive_whole_and_in_order():
    results, proc = _worker(_send_three)
    messages = _collect(results, proc)
    assert [m[0] for m in messages] == ["first", "big", "last"]
    assert messages[1][1] == b"x" * BIG and messages[2][1] == {"speedup": 1.5}
    assert results.ended and not results.cut_short and proc.exitcode == 0


def test_a_worker_dying_mid_message_ends_its_channel_without_stalling_the_reader():
    results, proc = _worker(_die_mid_message)
    messages = _collect(results, proc)
    assert messages == [("whole", 1)]
    assert results.ended and results.cut_short and proc.exitcode == 3  # (_collect gives up after 60 s)
    assert results.receive() == []
    results.close()
    assert results.receive() == []


@pytest.mark.parametrize("kind", ["length", "pickle"])
def test_bytes_that_frame_no_message_mark_the_channel_corrupted(kind):
    results, proc = _worker(_write_garbage, kind)
    try:
        messages, deadline = [], time.monotonic() + 30
        while not results.corrupted and time.monotonic() < deadline:
            wait_any([results], timeout=0.2)
            messages += results.receive()
        assert results.corrupted and results.ended and proc.is_alive()
        assert messages == [("whole", 1)]
        assert results.receive() == []
    finally:
        proc.kill()
        proc.join()
        results.close()
