"""What a side prints (its stdout and stderr), kept by the parent in memory and bounded.

A side's output is the candidate's to fill. Written to a log file it landed on the host's disk, up to
the side's file-size limit (512 MiB) for a candidate that prints in a loop. Here the side writes into
a pipe that a thread of the parent drains as fast as it fills, keeping the first `head_bytes` and
the last `tail_bytes` and counting what falls between: nothing of it reaches the disk, the parent
holds at most about twice the bound in memory, and the text still shows how the output began and how
it ended (a traceback, a confinement error), with the number of bytes dropped between.

Draining continuously matters as much as the bound: a pipe nobody reads fills (64 KiB) and then
blocks the side's next write, inside a timed window or for good. The thread sleeps in poll() while
the side is quiet (no periodic wake-up beside a timed window), and ends at the pipe's end of file
(every process that held its write end has exited) or when `close` tells it to (a process that
escaped the side's tree may hold the write end open for ever: closing never waits on it)."""

from __future__ import annotations

import os
import select
import threading

_CHUNK = 1 << 16  # one read: a pipe's default capacity


class ChildOutput:
    """One side's output pipe and the thread that drains it. The side gets `write_fd` as its stdout
    and stderr; the parent closes its own copy once the side holds it (or the end of file never comes)."""

    def __init__(self, head_bytes: int, tail_bytes: int):
        self.head_bytes, self.tail_bytes = max(0, head_bytes), max(0, tail_bytes)
        self._read_fd, self.write_fd = os.pipe()
        self._stop_r, self._stop_w = os.pipe()  # closing the write end wakes the thread to stop
        self._head, self._tail = bytearray(), bytearray()
        self.total = 0  # bytes the side wrote, kept or not
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._drain, name="cuda-l1-side-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        poller = select.poll()  # not select(): a busy parent's descriptors may be numbered past 1024
        poller.register(self._read_fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if self._stop_r in events:
                    return
                chunk = os.read(self._read_fd, _CHUNK)
                if not chunk:
                    return
                self._keep(chunk)
        except OSError:  # the pipe broke: what was kept stays readable
            return
        finally:
            os.close(self._read_fd)
            os.close(self._stop_r)
            self._ended.set()

    def _keep(self, chunk: bytes) -> None:
        with self._lock:
            self.total += len(chunk)
            room = self.head_bytes - len(self._head)
            if room > 0:
                self._head += chunk[:room]
                chunk = chunk[room:]
            if chunk and self.tail_bytes:
                self._tail += chunk
                if len(self._tail) > 2 * self.tail_bytes:  # trimmed now and then, not on every read
                    del self._tail[: len(self._tail) - self.tail_bytes]

    @property
    def dropped(self) -> int:
        """Bytes the side wrote that are not kept (between the head and the tail)."""
        with self._lock:
            return self.total - len(self._head) - min(len(self._tail), self.tail_bytes)

    def text(self) -> str:
        """What was read so far: the head, a line counting what was dropped, the tail."""
        with self._lock:
            tail = bytes(self._tail[len(self._tail) - min(len(self._tail), self.tail_bytes):])
            dropped = self.total - len(self._head) - len(tail)
            marker = f"\n[... {dropped} bytes dropped ...]\n".encode() if dropped else b""
            data = bytes(self._head) + marker + tail
        return data.decode("utf-8", errors="replace")

    def settle(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the end of the output (the side has exited and all it wrote is
        read); whether it came."""
        return self._ended.wait(timeout)

    def close(self, timeout: float = 1.0) -> str:
        """Wait up to `timeout` s for the end of the output, stop the thread, return the text. Never
        blocks much longer than `timeout`, whoever still holds the pipe."""
        if not self._closed:
            self._closed = True
            self._ended.wait(timeout)
            os.close(self._stop_w)
            self._thread.join(timeout=1.0)
        return self.text()
