"""Text that can be stored and printed: JSON lets anyone send a lone surrogate ("\\ud800"), which Python
keeps in a str but no UTF-8 encoder takes, so a store, a report or a terminal write would fail on it."""

from __future__ import annotations


def encodable(text: str) -> str:
    """`text` with each lone surrogate as '?' (unchanged, and cheap, when it is ASCII)."""
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def has_surrogate(text: str) -> bool:
    """Whether `text` holds a lone surrogate (what `encodable` replaces)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_CONTROL = {c: "?" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}


def printable(text: str, limit: int = 200) -> str:
    """`text` as one line a terminal shows as it is: control characters (NUL, newline, the escape that
    starts a terminal's colour or cursor codes) each as '?', lone surrogates too, at most `limit` characters.
    For the names a task source gives itself (a solution set's task_name, a file name), which every
    progress line, table and report prints."""
    return encodable(text).translate(_CONTROL)[:limit]
