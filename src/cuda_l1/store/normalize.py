"""Identities of candidate code: the exact-content id and the normalised-code hash.

A candidate's id (`candidate_id`, the store's key and `Verdict.candidate_id`) is a hash of its exact
text: two sources that differ in one trailing space or in line-end style are two candidates, each
with verdicts of its own, since such a difference can change what runs (a backslash followed by a
space is a syntax error where the stripped line continues; a string literal keeps its spaces).

Two candidates that differ only in comments, blank lines or spacing share a `norm_hash`: listings
show one of them (the fastest of a group, for prompts and training data). It never stands in for a
verdict: each exact source is evaluated on its own (engine.py), since a program can read its own
layout (its line numbers, its comments through linecache) and behave differently. String contents
are kept whole, line breaks and indentation inside them included: a changed string literal can
change what runs (an inline CUDA source, a macro continued over a blank line, exec'd code). Line ends
are made `\n` first, the way the compiler reads them: a lone `\r` ends a line for `compile()` but
not for `tokenize`, which would otherwise take everything after `# comment\r` for part of the
comment and hide it from the hash.
"""

from __future__ import annotations

import hashlib
import io
import json
import tokenize

from cuda_l1.tasks.task import code_id

# Tokens that carry no program meaning once layout is ignored. INDENT/DEDENT stay (as markers, not
# their width) because indentation decides block structure in Python.
_DROPPED = {tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER, tokenize.ENCODING}


def candidate_id(code: str) -> str:
    """Id of a candidate: `tasks.code_id` of its exact text, the id the evaluator puts in
    `Verdict.candidate_id` (never the normalised `source_id` that task ids use)."""
    return code_id(code)


# Python 3.12 splits f-strings into several tokens (3.11 keeps one STRING token); taking the f-string's
# exact source text keeps the normal form, and so norm_hash, the same across Python versions.
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)


def _token_form(code: str) -> str:
    lines = io.StringIO(code).readlines()
    parts: list[str] = []
    depth, fstring_start = 0, (0, 0)
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if _FSTRING_START is not None and tok.type == _FSTRING_START:
            depth += 1
            if depth == 1:
                fstring_start = tok.start
            continue
        if depth:
            if tok.type == _FSTRING_END:
                depth -= 1
                if depth == 0:
                    parts.append(_kept_whole(_source_slice(lines, fstring_start, tok.end)))
            continue
        if tok.type in _DROPPED:
            continue
        if tok.type == tokenize.NEWLINE:
            parts.append("\n")
        elif tok.type == tokenize.INDENT:
            parts.append("<INDENT>")
        elif tok.type == tokenize.DEDENT:
            parts.append("<DEDENT>")
        elif tok.type == tokenize.STRING:
            parts.append(_kept_whole(tok.string))
        else:
            parts.append(tok.string)
    # One space between tokens: `x=1` and `x = 1` give the same form, and adjacent names stay apart.
    lines = " ".join(parts).split("\n")
    return "\n".join(line.strip() for line in lines if line.strip())


def _kept_whole(text: str) -> str:
    """A string token with its line breaks marked by NUL (which no source can hold), so that the
    line splitting and stripping below never reach inside it."""
    return text.replace("\n", "\0")


def _source_slice(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    (row0, col0), (row1, col1) = start, end
    if row0 == row1:
        return lines[row0 - 1][col0:col1]
    return lines[row0 - 1][col0:] + "".join(lines[row0:row1 - 1]) + lines[row1 - 1][:col1]


def _line_form(code: str) -> str:
    return "\n".join(line.strip() for line in code.splitlines() if line.strip())


def normalize_code(code: str) -> str:
    """Layout-free form of Python code; falls back to stripped non-empty lines if tokenize fails.

    Tokenize fails on truncated code (an unclosed bracket or string) and on inconsistent dedents;
    such code still deserves a stable identity, just a coarser one.
    """
    code = code.replace("\r\n", "\n").replace("\r", "\n")
    try:
        return "tok:" + _token_form(code)
    except Exception:  # TokenError, IndentationError, SyntaxError, ValueError (null bytes), ...
        return "lines:" + _line_form(code)


def norm_hash(code: str) -> str:
    """16 hex digits of the SHA-256 of the normalised code."""
    return hashlib.sha256(normalize_code(code).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def stable_key(value) -> str:
    """16 hex digits identifying a JSON-able value (an evaluation config, a versions dict).

    Keys are sorted so dict order does not matter; an empty value gives "" so the default key reads as empty.
    """
    if value in (None, "", {}):
        return ""
    if isinstance(value, str):
        return value
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
