"""A run-directory file this version cannot read is set aside, never overwritten: kept for the user
(an edit gone wrong, a file cut short, a newer version's format) and out of the way of the run."""

from __future__ import annotations

import contextlib
from pathlib import Path


def set_aside(path: str | Path) -> Path | None:
    """Rename `path` to NAME.unreadable, or NAME.unreadable.N where earlier ones exist (each is kept).
    Returns where it went, or None where it could not be moved (it is then left as it was)."""
    path = Path(path)
    aside = path.with_name(f"{path.name}.unreadable")
    for n in range(2, 1000):
        if not aside.exists():
            break
        aside = path.with_name(f"{path.name}.unreadable.{n}")
    with contextlib.suppress(OSError):
        path.replace(aside)
        return aside
    return None
