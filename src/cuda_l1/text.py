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
