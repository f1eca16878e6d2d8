"""The task model: a KernelBench-format PyTorch reference, named, levelled and content-addressed.

A task source defines `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()` at module
level. Everything here is static (parsing only): loading a task never executes it.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass, field

from cuda_l1.errors import TaskError
from cuda_l1.text import printable

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
_NUMBER_PREFIX = re.compile(r"^(\d+)_")


def normalize_source(source: str) -> str:
    """Line endings and trailing whitespace do not change what a task is, so they do not change its id."""
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n") + "\n"


def source_id(source: str) -> str:
    """Stable id of a task source: the first 12 hex digits of the SHA-256 of its normalised form.

    For tasks only (Task.id). A candidate is identified by `code_id`: two candidates that normalise
    alike can still be different programs."""
    return hashlib.sha256(normalize_source(source).encode()).hexdigest()[:12]


def code_id(source: str) -> str:
    """Id of a candidate program: the first 16 hex digits of the SHA-256 of its exact text, UTF-8.

    Exact bytes, nothing normalised: trailing whitespace and line-end style can change what runs (a
    backslash followed by a space is a syntax error, the stripped line a continuation; a string
    literal keeps its spaces), so a verdict may only stand for the very same text. 16 digits, not
    source_id's 12: an exact id is never mistaken for a normalised one (a store written before exact
    ids held 12-digit ones; its migration renames each row without ever meeting another row's id),
    and 64 bits keep collisions out of reach for any number of candidates a store will hold.
    `surrogatepass`: a lone surrogate still gets an id instead of an exception (completions are
    cleaned of them where they arrive, llm.client.Completion, since the store cannot hold them).
    """
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True)
class Task:
    """One optimisation problem: a reference module and how to build its inputs."""

    name: str  # e.g. "19_ReLU" (file stem in KernelBench layout)
    level: int  # 1, 2 or 3 as in KernelBench; 0 when the source gives no level
    source: str  # the reference code, exactly as loaded
    origin: str = ""  # where it came from: a path, "builtin:level1/…", "file.jsonl:12"
    description: str = ""  # first line of the module's (or Model's) docstring
    number: int | None = None  # KernelBench problem number (the name's numeric prefix) when known
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def id(self) -> str:
        return source_id(self.source)

    @property
    def key(self) -> str:
        """Human-readable key, unique within a KernelBench-style suite: 'L1/19_ReLU'."""
        return f"L{self.level}/{self.name}"

    def summary(self) -> dict:
        return {
            "id": self.id,
            "name": self.name,
            "level": self.level,
            "number": self.number,
            "description": self.description,
            "origin": self.origin,
        }


def number_from_name(name: str) -> int | None:
    match = _NUMBER_PREFIX.match(name)
    return int(match.group(1)) if match else None


def check_task_source(source: str, origin: str) -> str:
    """Parse a task source and check it defines the KernelBench names; return its one-line description.

    Raises TaskError naming the file (and line) on a syntax error or a missing definition.
    """
    try:
        tree = ast.parse(source, filename=origin)
    except SyntaxError as exc:
        raise TaskError(
            f"syntax error: {exc.msg}. A task file must be valid Python defining class Model, "
            "get_inputs() and get_init_inputs().",
            path=origin,
            line=exc.lineno,
        ) from None
    except ValueError as exc:  # e.g. null bytes in the source
        raise TaskError(f"cannot parse the source: {exc}.", path=origin) from None
    except (RecursionError, MemoryError):  # a chain of thousands of operators, say
        raise TaskError("cannot parse the source: nested too deeply for Python's parser.", path=origin) from None

    defined: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    defined[target.id] = node
    missing = [name for name in REQUIRED_NAMES if name not in defined]
    if missing:
        raise TaskError(
            f"missing {', '.join(missing)} at module level. A KernelBench-format task defines "
            "class Model(nn.Module), get_inputs() returning the forward arguments and "
            "get_init_inputs() returning the constructor arguments.",
            path=origin,
        )
    if not isinstance(defined["Model"], ast.ClassDef):
        raise TaskError("'Model' must be a class (an nn.Module subclass).", path=origin)

    doc = ast.get_docstring(tree) or ast.get_docstring(defined["Model"]) or ""  # type: ignore[arg-type]
    return doc.strip().splitlines()[0].strip() if doc.strip() else ""


def make_task(source: str, *, name: str, level: int, origin: str, number: int | None = None) -> Task:
    """Build a Task after checking its source statically (no code is executed)."""
    description = printable(check_task_source(source, origin))
    if number is None:
        number = number_from_name(name)
    return Task(name=task_name(name), level=level, source=source, origin=origin, description=description,
                number=number)


NAME_CHARS = 255  # a file name's limit: no task file's stem is cut


def task_name(text: str) -> str:
    """A task's name as printed and matched (a candidate file's stem goes through it too): one line."""
    return printable(text, NAME_CHARS)
