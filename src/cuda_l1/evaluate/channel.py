"""The private result channel between the trusted parent and a sandboxed child.

Why not stdout or pickle: whatever the candidate prints is a log, never a result, and unpickling data
written by untrusted code would run that code in the parent. So messages are framed JSON headers plus
raw tensor bytes, each frame authenticated with HMAC-SHA256 under a per-child key and a per-direction
sequence number (no replay, no reordering). The key is the first thing the child reads from its pipe,
before any candidate code is imported; frames written by anything without the key are refused.

Limits, stated honestly: candidate code shares the child's address space, so a determined candidate
could find the key in memory. The parent therefore never trusts the *content* of a frame either: every
output is compared against the parent's own reference, every timing is bounded by the parent's own
wall clock, and the process tree is inspected from outside (see sandbox.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import select
import struct
import sys
import time
from dataclasses import dataclass

MAGIC = b"CL1F"
KEY_BYTES = 32
_PREFIX = struct.Struct("<4sII")  # magic, header length, number of blobs
_BLOB_LEN = struct.Struct("<Q")
_MAC_BYTES = 32


PARENT_SEND_TIMEOUT_S = 60.0  # how long the parent waits for a side to read what it sends, then gives up on it


class ChannelError(Exception):
    """The peer sent something that is not a valid authenticated frame (or nothing at all)."""


class ChannelClosed(ChannelError):
    """The peer closed its end (it exited or crashed)."""


class ChannelTimeout(ChannelError):
    """No complete frame arrived before the deadline."""


@dataclass
class Envelope:
    """One authenticated frame, opened: its JSON header and its binary parts (not yet validated)."""

    header: dict
    blobs: list[bytes]


def unread_bytes(fd: int) -> int:
    """Bytes written into a pipe and not yet read from it (-1 if that cannot be told)."""
    import fcntl
    import termios

    try:
        return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)
    except OSError:
        return -1


def new_key() -> bytes:
    return os.urandom(KEY_BYTES)


class Channel:
    """One end of a framed, authenticated, bidirectional pipe pair."""

    def __init__(self, read_fd: int, write_fd: int, key: bytes, *, is_parent: bool, max_frame_bytes: int = 1 << 32,
                 send_timeout: float | None = None):
        self.read_fd = read_fd
        self.write_fd = write_fd
        # With a send timeout the write end is non-blocking: a peer that stops reading (a full pipe)
        # makes send() raise ChannelTimeout instead of blocking its writer for good.
        self.send_timeout = send_timeout
        if send_timeout is not None:
            os.set_blocking(write_fd, False)
        self._key = key
        self._send_dir = b"P" if is_parent else b"C"
        self._recv_dir = b"C" if is_parent else b"P"
        self._send_seq = 0
        self._recv_seq = 0
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()

    # -- sending -------------------------------------------------------------------------------
    def _mac(self, direction: bytes, seq: int, header: bytes, blobs: list[bytes]) -> bytes:
        mac = hmac.new(self._key, direction + struct.pack("<Q", seq) + header, hashlib.sha256)
        for blob in blobs:
            mac.update(_BLOB_LEN.pack(len(blob)))
            mac.update(blob)
        return mac.digest()

    def send(self, header: dict, blobs: list[bytes] | None = None) -> None:
        blobs = blobs or []
        head = json.dumps(header, separators=(",", ":"), allow_nan=True).encode()
        parts = [_PREFIX.pack(MAGIC, len(head), len(blobs))]
        parts += [_BLOB_LEN.pack(len(b)) for b in blobs]
        parts.append(head)
        parts += blobs
        parts.append(self._mac(self._send_dir, self._send_seq, head, blobs))
        self._send_seq += 1
        data = memoryview(b"".join(parts))
        deadline = None if self.send_timeout is None else time.monotonic() + self.send_timeout
        while data:
            try:
                written = os.write(self.write_fd, data)
            except BrokenPipeError:
                raise ChannelClosed("the other side closed the channel") from None
            except BlockingIOError:  # the pipe is full: wait until the peer reads, up to the deadline
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ChannelTimeout("the other side stopped reading") from None
                select.select([], [self.write_fd], [], min(remaining, 1.0))
                continue
            data = data[written:]

    # -- receiving -----------------------------------------------------------------------------
    def _fill(self, need: int, deadline: float | None) -> None:
        """Read until the buffer holds `need` bytes. Nothing is consumed here, so a timeout in the
        middle of a frame loses nothing: the next recv() continues where this one stopped."""
        while len(self._buffer) < need:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ChannelTimeout("no reply before the deadline")
                ready, _, _ = select.select([self.read_fd], [], [], min(remaining, 1.0))
                if not ready:
                    continue
            chunk = os.read(self.read_fd, max(need - len(self._buffer), 1 << 20))
            if not chunk:
                raise ChannelClosed("the other side closed the channel")
            self._buffer += chunk

    def recv(self, timeout: float | None = None) -> Envelope:
        return self.parse(self.recv_frame(timeout))

    def buffered(self) -> int:
        """Bytes received and not yet returned as a frame (the start of one, or whole ones)."""
        return len(self._buffer)

    def has_pending(self) -> bool:
        """Whether anything has arrived that no request asked for yet."""
        return bool(self._buffer) or bool(select.select([self.read_fd], [], [], 0)[0])

    def recv_frame(self, timeout: float | None = None) -> bytes:
        """The next whole frame's bytes, neither authenticated nor parsed (see parse): a timed window
        ends when the reply has arrived, and what the parent then does with it is not the side's time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._fill(_PREFIX.size, deadline)
        magic, head_len, n_blobs = _PREFIX.unpack_from(self._buffer, 0)
        if magic != MAGIC or n_blobs > 4096:
            raise ChannelError("malformed frame")
        self._fill(_PREFIX.size + n_blobs * _BLOB_LEN.size, deadline)
        lengths = [_BLOB_LEN.unpack_from(self._buffer, _PREFIX.size + i * _BLOB_LEN.size)[0] for i in range(n_blobs)]
        body = head_len + sum(lengths)
        if body > self.max_frame_bytes:
            raise ChannelError(f"a frame of {body} bytes, over the {self.max_frame_bytes} bytes this message may take")
        total = _PREFIX.size + n_blobs * _BLOB_LEN.size + body + _MAC_BYTES
        self._fill(total, deadline)
        frame = bytes(self._buffer[:total])
        del self._buffer[:total]
        return frame

    def parse(self, frame: bytes) -> Envelope:
        """Authenticate and parse a frame from recv_frame (frames must be parsed in arrival order)."""
        _, head_len, n_blobs = _PREFIX.unpack_from(frame, 0)
        lengths = [_BLOB_LEN.unpack_from(frame, _PREFIX.size + i * _BLOB_LEN.size)[0] for i in range(n_blobs)]
        start = _PREFIX.size + n_blobs * _BLOB_LEN.size
        head = frame[start : start + head_len]
        blobs, offset = [], start + head_len
        for n in lengths:
            blobs.append(frame[offset : offset + n])
            offset += n
        mac = frame[offset : offset + _MAC_BYTES]
        if not hmac.compare_digest(mac, self._mac(self._recv_dir, self._recv_seq, head, blobs)):
            raise ChannelError("frame failed authentication")
        self._recv_seq += 1
        try:
            header = json.loads(head)
        except (ValueError, RecursionError):
            raise ChannelError("frame header is not JSON (or nested too deeply)") from None
        if not isinstance(header, dict):
            raise ChannelError("frame header is not an object")
        return Envelope(header, blobs)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


# -- tensors as data (no pickle) -------------------------------------------------------------------
def encode_tensor(tensor) -> tuple[dict, bytes]:
    """Describe a tensor and copy its values to bytes (row-major, contiguous)."""
    import torch

    t = tensor.detach()
    meta = {
        "dtype": str(t.dtype).replace("torch.", ""),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "device": str(t.device),
    }
    flat = t.to("cpu").contiguous()
    if flat.numel() == 0:
        return meta, b""
    return meta, flat.reshape(-1).view(torch.uint8).numpy().tobytes()


_DTYPES: dict[str, object] = {}


def decode_tensor(meta: dict, blob: bytes):
    """Rebuild a CPU tensor from encode_tensor's output; validates sizes instead of trusting them."""
    import torch

    if not _DTYPES:
        for name in dir(torch):
            value = getattr(torch, name)
            if isinstance(value, torch.dtype):
                _DTYPES[name] = value
    dtype = _DTYPES.get(str(meta.get("dtype")))
    shape = meta.get("shape")
    if dtype is None or not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise ChannelError("bad tensor description")
    numel = 1
    for s in shape:
        numel *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(blob) != numel * itemsize:
        raise ChannelError("tensor byte count does not match its shape")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).view(dtype).reshape(shape)
