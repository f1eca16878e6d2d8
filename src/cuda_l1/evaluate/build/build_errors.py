"""Errors of the build layer.

`BuildError` means the `load_inline(...)` call itself is unusable (bad argument, refused flag or
source construct); `CompileError` means the arguments were fine but the compiler or linker failed.
Both are `UserError`s: the evaluator turns them into a verdict, never into an outage.
"""

from __future__ import annotations

from cuda_l1.errors import UserError


class BuildError(UserError):
    """An extension that cannot be built as asked: invalid argument, refused flag or source."""


class CompileError(BuildError):
    """The compiler or linker rejected the sources; `log` holds the trimmed compiler output."""

    def __init__(self, message: str, *, key: str = "", log: str = ""):
        self.key = key
        self.log = log
        super().__init__(message)
