"""Keeping endpoint keys inside the client that uses them.

The LLM client reads its key from the environment once, when it is created. Nothing the optimizer
starts afterwards needs the key: evaluation workers are spawned with a copy of the environment, and
every candidate runs under one of them. So, once the client exists, the key variables leave the
environment for the rest of the run, and their values are blanked in the process's start-up
environment block too: that block is what /proc/<pid>/environ shows, and a candidate that can read
/proc (a sandbox running as root, for one) would otherwise find the key there, however well its own
environment was scrubbed.
"""

from __future__ import annotations

import ctypes
import os
import sys
from contextlib import contextmanager
from typing import Iterable, Iterator


def _environ_block() -> tuple[int, int] | None:
    """Start and end address of this process's start-up environment (fields 50-51 of /proc/self/stat)."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # field 3 onwards; the command name may hold spaces
    try:
        start, end = int(fields[50 - 3]), int(fields[51 - 3])
    except (IndexError, ValueError):
        return None
    return (start, end) if 0 < start < end else None


def blank_startup_environ(names: Iterable[str]) -> list[str]:
    """Overwrite the values of these variables in the start-up environment block with NUL bytes.

    Returns the names that were found and blanked. Linux only; elsewhere it does nothing.
    """
    if not sys.platform.startswith("linux"):
        return []
    block = _environ_block()
    if block is None:
        return []
    try:
        with open("/proc/self/environ", "rb") as handle:
            shown = handle.read()
    except OSError:
        return []
    start, end = block
    wanted = {name.encode() + b"=" for name in names}
    blanked, offset = [], 0
    for entry in shown.split(b"\0"):
        prefix = next((p for p in wanted if entry.startswith(p)), None)
        value_at = start + offset + (len(prefix) if prefix else 0)
        if prefix and entry[len(prefix):] and value_at + len(entry) - len(prefix) <= end:
            ctypes.memset(value_at, 0, len(entry) - len(prefix))
            blanked.append(prefix[:-1].decode())
        offset += len(entry) + 1
    return blanked


@contextmanager
def hidden_credentials(names: Iterable[str]) -> Iterator[list[str]]:
    """Remove these variables from the environment (and blank them in /proc/self/environ) for the block.

    Create the LLM client before entering: it keeps the key it read. The variables are put back in
    `os.environ` on exit (for callers that use the library in a longer-lived process); the start-up
    block stays blank.
    """
    names = sorted({n for n in names if n})
    saved = {name: os.environ[name] for name in names if name in os.environ}
    blank_startup_environ(saved)
    for name in saved:
        del os.environ[name]  # unsetenv: children spawned from now on do not inherit it
    try:
        yield list(saved)
    finally:
        for name, value in saved.items():
            os.environ.setdefault(name, value)
