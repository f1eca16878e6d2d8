"""Turning an LLM completion into a candidate module (or a clear reason why there is none).

Completions are messy: chatter around the code, several code blocks (drafts, quoted exemplars, a CUDA
source shown separately), reasoning sections, and output cut off at the token limit. The answer is the
last block that defines `class ModelNew`. Parsing is static (ast); nothing here runs the code.
"""

from __future__ import annotations

import ast
import re
import textwrap
import warnings
from dataclasses import dataclass

OK = "ok"
PARSE_ERROR = "parse_error"
TARGET = "ModelNew"

_THINK_BLOCK = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.S | re.I)
_THINK_CLOSE = re.compile(r"</think(?:ing)?>", re.I)
_THINK_OPEN = re.compile(r"<think(?:ing)?>", re.I)
_OPEN_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*?)[ \t]*$")
# "Here is the code:```python" — an opening fence glued to prose; give it its own line.
_GLUED_FENCE = re.compile(r"(?<=\S)[ \t]*(```(?:python|py)\b)", re.I)
_CLOSE_THEN_OPEN = re.compile(r"^(?P<close>[ \t]*(?:`{3,}|~{3,}))[ \t]*(?P<open>```(?:python|py)\b.*)$", re.I)
_CLASS_TEXT = re.compile(rf"^\s*class\s+{TARGET}\b", re.M)


@dataclass
class ParseResult:
    """What a completion holds: the module to evaluate (if any) and the model's analysis."""

    code: str | None  # the module source, or None
    analysis: str  # the text outside code blocks (the model's comparative analysis)
    error: str  # why there is no usable code ("" when status is ok)
    status: str  # "ok" | "parse_error"
    truncated: bool = False  # the code came from an unterminated final block

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass
class _Block:
    lang: str
    code: str
    closed: bool
    tree: ast.Module | None = None
    syntax_error: str = ""


def _failure(error: str, analysis: str = "") -> ParseResult:
    return ParseResult(code=None, analysis=analysis, error=error, status=PARSE_ERROR)


def _strip_reasoning(text: str) -> tuple[str, bool]:
    """Remove reasoning sections; report whether the text ends inside one (unterminated <think>)."""
    text = _THINK_BLOCK.sub("", text)
    # Templates that open the section in the prompt leave only the closing tag in the completion.
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        text = text[closes[-1].end():]
    opened = _THINK_OPEN.search(text)
    if opened:
        return text[: opened.start()], True
    return text, False


def _split_blocks(text: str) -> tuple[list[_Block], str]:
    """Fenced blocks (CommonMark-style: a closing fence is the same character, at least as long)."""
    lines = text.split("\n")
    blocks: list[_Block] = []
    prose: list[str] = []
    i = 0
    while i < len(lines):
        match = _OPEN_FENCE.match(lines[i])
        if not match:
            glued = _GLUED_FENCE.search(lines[i])
            if glued:  # (in prose only: inside a block, "```python" may be in the code's own strings)
                lines[i:i + 1] = [lines[i][:glued.start()], lines[i][glued.start(1):]]
            prose.append(lines[i])
            i += 1
            continue
        fence = match.group("fence")
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        info = match.group("info").strip().split()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not closing.match(lines[j]):
            reopened = _CLOSE_THEN_OPEN.match(lines[j])
            if reopened and closing.match(reopened.group("close")):  # "``` ```python": a block ends, the next starts
                lines[j:j + 1] = [reopened.group("close"), reopened.group("open")]
                break
            body.append(lines[j])
            j += 1
        code = "\n".join(body)
        if match.group("indent"):
            code = textwrap.dedent(code)  # a block nested in a list item carries the item's indent
        blocks.append(_Block(lang=info[0].lower() if info else "", code=code, closed=j < len(lines)))
        i = j + 1
    return blocks, "\n".join(prose)


def _parse(block: _Block) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. invalid escape sequences: the evaluator's business
            block.tree = ast.parse(block.code)
    except SyntaxError as exc:
        block.syntax_error = f"SyntaxError: {exc.msg} (line {exc.lineno})"
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        block.syntax_error = f"{type(exc).__name__}: {exc}"


def _target_class(tree: ast.Module | None) -> ast.ClassDef | None:
    if tree is None:
        return None
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == TARGET), None)


def _defines_target(tree: ast.Module | None) -> bool:
    if _target_class(tree) is not None:
        return True
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == TARGET for t in targets):
            return True
    return False


def _has_forward(tree: ast.Module | None) -> bool:
    cls = _target_class(tree)
    if cls is None:  # ModelNew = something(...): nothing to inspect
        return _defines_target(tree)
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "forward" for n in cls.body)


def _module(code: str) -> str:
    return code.strip("\n") + "\n"


def _choose(blocks: list[_Block]) -> tuple[_Block | None, str]:
    """The block to evaluate, or why none qualifies."""
    for block in blocks:
        _parse(block)
    complete = [b for b in blocks if b.closed and _defines_target(b.tree)]
    if blocks and not blocks[-1].closed:
        last = blocks[-1]
        if _defines_target(last.tree) and _has_forward(last.tree):
            return last, ""  # cut off, but at a point where the module is whole
        # An earlier complete block stands in only when the cut-off block was not itself an attempt
        # at the module (e.g. a trailing shell snippet): a cut-off answer must not revive a draft.
        if not complete or _CLASS_TEXT.search(last.code):
            why = last.syntax_error or f"it does not define class {TARGET} with a forward method"
            return None, (
                "the final code block is unterminated (the output was probably cut off at the token limit) "
                f"and is not a complete module: {why}."
            )
    if complete:
        return complete[-1], ""
    # Fall back to a block that states the class but does not parse: the evaluator's compile error
    # tells the model more than a parse error would.
    textual = [b for b in blocks if b.closed and _CLASS_TEXT.search(b.code)]
    if textual:
        return textual[-1], ""
    return None, f"none of the {len(blocks)} code block(s) defines class {TARGET}."


def _parse_completion(text: str) -> ParseResult:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        return _failure("the completion is empty.")
    body, in_reasoning = _strip_reasoning(text)
    blocks, prose = _split_blocks(body)
    analysis = prose.strip()
    if not blocks:
        whole = _Block(lang="", code=body, closed=True)
        _parse(whole)
        if body.strip() and _defines_target(whole.tree):  # bare code without fences
            return ParseResult(code=_module(body), analysis="", error="", status=OK)
        if in_reasoning:
            return _failure("the output ended inside a <think> section, before any code block.", analysis)
        return _failure(f"no code block found; expected one ```python block defining class {TARGET}.", analysis)
    chosen, error = _choose(blocks)
    if chosen is None:
        return _failure(error, analysis)
    return ParseResult(code=_module(chosen.code), analysis=analysis, error="", status=OK, truncated=not chosen.closed)


def parse_completion(text: str) -> ParseResult:
    """Extract the candidate module from a completion. Never raises: failures come back as parse_error."""
    if not isinstance(text, str):
        return _failure(f"expected the completion text as a string, got {type(text).__name__}.")
    try:
        return _parse_completion(text)
    except Exception as exc:  # a parser bug must cost one candidate, not the optimisation run
        return _failure(f"internal parser error ({type(exc).__name__}: {exc}).")
