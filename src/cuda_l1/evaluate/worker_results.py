"""One evaluation worker's results to its pool: a pipe no other process writes.

The workers used to share one multiprocessing queue. Its writers take a lock shared between processes
for each message, and a worker that died holding it (a task's `os._exit` while the worker's feeder
thread was between writing and releasing; any kill mid-write) left it held for good: every other
worker's verdicts then waited forever behind it, and the pool hung. Here each worker writes its own
pipe, so a death costs only its own channel, which its replacement does not reuse.

The parent reads without blocking: a message is a length and a pickle (the worker is trusted: it runs
no candidate code), kept in a buffer until it is whole. A message cut short by the worker's death is
dropped when the pipe ends; it can never stall the reader. Bytes that frame no message (only the
task's own code, run in the worker, could write them) mark the channel corrupted, and the pool ends
that worker as it would a dead one.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import pickle
import struct

_HEADER = struct.Struct("!Q")  # the pickle's length
_READ_BYTES = 1 << 20
MAX_MESSAGE_BYTES = 1 << 30  # a verdict takes a few MiB at most: a longer length is a corrupted stream


class WorkerResults:
    """Created by the pool for one worker process: `writer` goes to the worker, the rest stays here."""

    def __init__(self, ctx):
        self.reader, self.writer = ctx.Pipe(duplex=False)
        os.set_blocking(self.reader.fileno(), False)
        self._buffer = bytearray()
        self.ended = False  # the worker's end closed (it exited): no more messages
        self.cut_short = False  # it ended in the middle of a message (dropped)
        self.corrupted = False  # bytes that are no message were written: nothing more is read

    def started(self) -> None:
        """The worker has its copy of the writer: drop ours, so its exit ends the pipe."""
        self.writer.close()

    def receive(self) -> list:
        """The whole messages that arrived, oldest first; never waits."""
        while not self.ended:
            try:
                chunk = os.read(self.reader.fileno(), _READ_BYTES)
            except BlockingIOError:
                break
            except OSError:  # (closed by close())
                chunk = b""
            if not chunk:
                self.ended = True
                self.cut_short = bool(self._buffer)
            self._buffer += chunk
        messages = []
        while len(self._buffer) >= _HEADER.size and not self.corrupted:
            (size,) = _HEADER.unpack_from(self._buffer)
            if size > MAX_MESSAGE_BYTES:
                self.corrupted = True
            elif len(self._buffer) >= _HEADER.size + size:
                try:
                    messages.append(pickle.loads(self._buffer[_HEADER.size:_HEADER.size + size]))
                except Exception:  # noqa: BLE001 - whatever the bytes were, they are no message of ours
                    self.corrupted = True
                del self._buffer[:_HEADER.size + size]
            else:
                break
        if self.corrupted:  # (the pool ends the worker: nothing after such bytes can be trusted to frame)
            self.ended = True
        if self.ended:
            self._buffer.clear()
        return messages

    def close(self) -> None:
        self.ended = True
        self.reader.close()


def wait_any(channels: list[WorkerResults], timeout: float) -> None:
    """Until one of the channels has something to read or ended, or `timeout` seconds passed."""
    multiprocessing.connection.wait([channel.reader for channel in channels if not channel.ended], timeout=timeout)


def send(writer, message) -> None:
    """In the worker: one whole message (blocks while the pipe is full). The pool being gone ends
    the worker quietly: nobody is left to judge for."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    try:
        while view:
            view = view[os.write(writer.fileno(), view):]
    except BrokenPipeError:
        raise SystemExit(0) from None
