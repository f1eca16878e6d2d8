"""How much of the host's disk the build cache may take (BuildConfig.max_entry_bytes, cache_max_bytes).

A candidate's source is compiled by the parent and its library published in a cache that outlives
the evaluation, so a candidate chooses what the host keeps: one `load_inline` whose source held
`static char ballast[400u << 20] = {1};` left a 420 MB library behind, and a module may ask for 16
builds. A build whose files exceed `max_entry_bytes` is published as a failed build (its files are
dropped, its error kept, so the same source is not compiled again); once the cache's entries exceed
`cache_max_bytes`, the ones used longest ago are removed. A lookup marks its entry as used.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path

# Directories of the cache that are not entries: builds in progress, locks, precompiled headers.
_NOT_ENTRIES = frozenset({"tmp", "locks", "pch"})


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


def too_large(workdir: Path, max_entry_bytes: int) -> str:
    """Why a finished build may not be kept ("" when it may)."""
    size = tree_bytes(workdir)
    if max_entry_bytes and size > max_entry_bytes:
        return (f"the build's files take {size / 2**20:.0f} MiB, more than the {max_entry_bytes / 2**20:.0f} MiB "
                "a build may keep in the cache (BuildConfig.max_entry_bytes)")
    return ""


def trim(root: Path, max_bytes: int, keep: str = "") -> list[str]:
    """Remove the entries used longest ago until the cache's entries take at most `max_bytes`; never
    `keep` (the entry just published), nor one whose key another builder holds locked. Returns the
    keys removed."""
    if not max_bytes:
        return []
    entries = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            if entry.name in _NOT_ENTRIES or not entry.is_dir():
                continue
            try:
                used = (entry / "meta.json").stat().st_mtime
            except OSError:
                continue  # not a published entry
            entries.append((used, entry.name, tree_bytes(entry)))
    total = sum(size for *_, size in entries)
    removed = []
    for _, key, size in sorted(entries):
        if total <= max_bytes:
            break
        if key == keep:
            continue
        if _remove_unlocked(root, key):
            total -= size
            removed.append(key)
    return removed


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
