"""The sides' scratch directories: made here, removed when their side is closed, and any still there
when the parent exits removed then (an evaluator its caller never closed, spares started ahead and
not used), so that runs do not leave empty directories behind in the temporary directory."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading

_live: set[str] = set()
_lock = threading.Lock()
_owner = os.getpid()  # a process forked from this one (a fork server, a side) removes none of them


def make(root: str | None) -> str:
    """A new private directory under `root` (the temporary directory by default)."""
    path = tempfile.mkdtemp(prefix="cuda-l1-", dir=root)
    os.chmod(path, 0o700)
    with _lock:
        _live.add(path)
    return path


def remove(path: str, keep: bool = False) -> None:
    """Remove `path` (`keep`: leave it where it is, and forget it)."""
    with _lock:
        _live.discard(path)
    if not keep:
        shutil.rmtree(path, ignore_errors=True)


@atexit.register
def _remove_left() -> None:
    if os.getpid() != _owner:
        return
    with _lock:
        left = list(_live)
    for path in left:
        remove(path)
