"""How much of the host's disk the build cache may take (BuildConfig.max_entry_bytes, cache_max_bytes).

A candidate's source is compiled by the parent and its library published in a cache that outlives
the evaluation, so a candidate chooses what the host keeps: one `load_inline` whose source held
`static char ballast[400u << 20] = {1};` left a 420 MB library behind, and a module may ask for 16
builds. A build whose files exceed `max_entry_bytes` is published as a failed build (its files are
dropped, its error kept, so the same source is not compiled again); once the cache's entries exceed
`cache_max_bytes`, the ones used longest ago are removed, down to `LOW_WATER` of it. A lookup marks
its entry as used.

Each entry's meta.json records its size, and `usage.json` the whole cache's, updated under a lock on
each publish, so a publish costs one small read and write: walking every entry's files on each
publish took 0.32 s for 10,000 entries. The cache is walked only when the running total passes the
limit (or its file is missing), and the walk writes the exact total back, so an entry removed by hand
or another tool costs at most one early walk.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path

# Directories of the cache that are not entries: builds in progress, locks, precompiled headers.
_NOT_ENTRIES = frozenset({"tmp", "locks", "pch"})
USAGE_FILE = "usage.json"  # {"bytes": the entries' total}, kept by note_published
LOW_WATER = 0.9  # a trim goes down to this share of the limit, so the next publishes need no walk


def tree_bytes(root: Path) -> int:
    """Bytes of the files under `root` (their apparent sizes; links not followed)."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def mark_used(entry: Path) -> None:
    """The entry was just looked up: its meta.json's time says so (the eviction order)."""
    with contextlib.suppress(OSError):
        os.utime(entry / "meta.json")


def too_large(size: int, max_entry_bytes: int) -> str:
    """Why a finished build of `size` bytes may not be kept ("" when it may)."""
    if max_entry_bytes and size > max_entry_bytes:
        return (f"the build's files take {size / 2**20:.0f} MiB, more than the {max_entry_bytes / 2**20:.0f} MiB "
                "a build may keep in the cache (BuildConfig.max_entry_bytes)")
    return ""


def entry_bytes(entry: Path) -> int:
    """An entry's size: what its meta.json recorded at publish, else its files walked."""
    meta = None
    with contextlib.suppress(OSError, ValueError):
        meta = json.loads((entry / "meta.json").read_text())
    size = meta.get("bytes") if isinstance(meta, dict) else None
    return size if isinstance(size, int) and size >= 0 else tree_bytes(entry)


def _entries(root: Path) -> list[tuple[float, str, int]]:
    """(last used, key, bytes) of every published entry."""
    entries = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            if entry.name in _NOT_ENTRIES or not entry.is_dir():
                continue
            try:
                used = (entry / "meta.json").stat().st_mtime
            except OSError:
                continue  # not a published entry
            entries.append((used, entry.name, entry_bytes(entry)))
    return entries


def trim(root: Path, max_bytes: int, keep: str = "") -> list[str]:
    """Remove the entries used longest ago until the cache's entries take at most `max_bytes`; never
    `keep` (the entry just published), nor one whose key another builder holds locked. Returns the
    keys removed."""
    return _trim(root, max_bytes, keep)[0]


def _trim(root: Path, max_bytes: int, keep: str) -> tuple[list[str], int]:
    """trim(), and the bytes the entries take after it."""
    entries = _entries(root)
    total = sum(size for *_, size in entries)
    removed = []
    for _, key, size in sorted(entries):
        if not max_bytes or total <= max_bytes:
            break
        if key == keep:
            continue
        if _remove_unlocked(root, key):
            total -= size
            removed.append(key)
    return removed, total


def note_published(root: Path, added_bytes: int, max_bytes: int, keep: str) -> list[str]:
    """An entry of `added_bytes` was just published as `keep`: add it to the running total and trim
    the cache to `LOW_WATER` of `max_bytes` once the total passes `max_bytes` (0: no limit, the total
    still kept, so that a later process with a limit reads a true one). Returns the keys removed."""
    locks = root / "locks"
    locks.mkdir(exist_ok=True)
    with open(locks / "usage.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            total = _read_total(root)
            total = _trim(root, 0, keep)[1] if total is None else total + added_bytes
            removed = []
            if max_bytes and total > max_bytes:
                removed, total = _trim(root, int(max_bytes * LOW_WATER), keep)
            _write_total(root, total)
            return removed
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_total(root: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        total = json.loads((root / USAGE_FILE).read_text()).get("bytes")
        if isinstance(total, int) and total >= 0:
            return total
    return None


def _write_total(root: Path, total: int) -> None:
    """Written whole, then renamed over the old file: a reader never sees half of it."""
    part = root / f"{USAGE_FILE}.{os.getpid()}"
    with contextlib.suppress(OSError):
        part.write_text(json.dumps({"bytes": total}))
        os.replace(part, root / USAGE_FILE)


def _remove_unlocked(root: Path, key: str) -> bool:
    """Remove entry `key` if no one holds its lock (a builder re-checks the cache under it)."""
    lock = root / "locks" / f"{key}.lock"
    try:
        fh = open(lock, "a")
    except OSError:
        shutil.rmtree(root / key, ignore_errors=True)
        return True
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        try:
            shutil.rmtree(root / key, ignore_errors=True)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    return True
