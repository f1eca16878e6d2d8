"""Task loaders: one file, a KernelBench-layout directory, the built-in suite, a JSONL solution set.

All loaders are static: they read and parse sources but never run them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterable

from cuda_l1.errors import TaskError, UserError
from cuda_l1.tasks.sizes import CPU, SIZES, gpu_sizes, sized
from cuda_l1.tasks.task import Task, make_task, number_from_name
from cuda_l1.text import encodable, has_surrogate

_LEVEL_DIR = re.compile(r"^level_?(\d+)$", re.IGNORECASE)
BUILTIN = "builtin"


@dataclass
class SolutionRecord:
    """One line of a published solution set (CUDA-L1 release format)."""

    task: Task  # built from `ref_code`
    candidate: str | None  # `custom_code`; None when the record has no candidate
    line: int  # 1-based line in the JSONL file
    claims: dict = field(default_factory=dict)  # every `score*`/`speedup*` field, as published
    record: dict = field(default_factory=dict)  # the remaining fields, untouched


def not_a_file(path: Path) -> str:
    """Why `path` is not a file to read: it is missing, or a directory."""
    return "a directory, not a file." if path.is_dir() else "no such file."


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TaskError("not UTF-8 text; a task file must be a Python source.", path=str(path)) from None
    except OSError as exc:
        raise TaskError(f"cannot read: {exc.strerror}.", path=str(path)) from None


def _level_of(path: Path) -> int:
    match = _LEVEL_DIR.match(path.parent.name)
    return int(match.group(1)) if match else 0


def _sort_key(path: Path) -> tuple:
    number = number_from_name(path.stem)
    return (_level_of(path), number if number is not None else 1 << 30, path.name)


def load_task_file(path: str | Path, level: int | None = None) -> Task:
    path = Path(path)
    if not path.is_file():
        raise TaskError(not_a_file(path), path=str(path))
    return make_task(
        _read_text(path), name=path.stem, level=_level_of(path) if level is None else level, origin=str(path)
    )


def load_directory(path: str | Path) -> list[Task]:
    """A KernelBench-layout directory (`level1/19_ReLU.py`, …), a single `levelN` folder, or a flat folder."""
    root = Path(path)
    if not root.is_dir():
        raise TaskError("no such directory.", path=str(root))
    level_dirs = sorted(p for p in root.iterdir() if p.is_dir() and _LEVEL_DIR.match(p.name))
    if level_dirs:
        files = [f for d in level_dirs for f in d.glob("*.py")]
    else:
        files = list(root.glob("*.py"))
    files = sorted((f for f in files if not f.name.startswith("_")), key=_sort_key)
    if not files:
        raise TaskError(
            "no tasks found. Expected KernelBench layout: level1/*.py, level2/*.py, level3/*.py "
            "(or Python task files directly in the folder).",
            path=str(root),
        )
    return [load_task_file(f) for f in files]


def builtin_root() -> Path:
    return Path(str(resources.files("cuda_l1.tasks") / "builtin"))


def builtin_gpu_sizes(task: Task) -> dict:
    """The GPU_SIZES a built-in task's file states ({} for a task that is not built in)."""
    path = builtin_root() / f"level{task.level}" / f"{task.name}.py"
    return gpu_sizes(path.read_text(encoding="utf-8")) if (task.origin or "").startswith("builtin:") and path.is_file() else {}


def load_builtin(sizes: str = CPU) -> list[Task]:
    """The built-in suite at `sizes` (tasks/sizes.py: cpu as written, gpu with each task's GPU_SIZES)."""
    tasks = load_directory(builtin_root())
    suffix = "" if sizes == CPU else f" ({sizes} sizes)"
    return [
        Task(
            name=t.name,
            level=t.level,
            source=sized(t.source, sizes),
            origin=f"builtin:level{t.level}/{t.name}.py{suffix}",
            description=t.description,
            number=t.number,
        )
        for t in tasks
    ]


def _claims(record: dict) -> dict:
    return {k: v for k, v in record.items() if k.startswith("score") or k.startswith("speedup")}


def _missing_candidate(value) -> bool:
    return value is None or (isinstance(value, str) and value.strip() in ("", "None", "null"))


def _whole(value):
    """1, "1" and 1.0 as 1 (what JSON writers produce for an id); 1.7, true, inf and the rest unchanged."""
    if isinstance(value, str) and value.strip().isdecimal() and value.isascii() and len(value) <= 12:
        return int(value)
    if type(value) is float and value.is_integer():
        return int(value)
    return value


def load_solutions_jsonl(path: str | Path) -> list[SolutionRecord]:
    """Read a JSONL solution set: one JSON object per line with level_id, task_id, ref_code, custom_code."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(not_a_file(path), path=str(path))
    text = _read_text(path)
    records: list[SolutionRecord] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TaskError(
                f"not valid JSON ({exc.msg} at column {exc.colno}). Each line must be one JSON object "
                "with level_id, task_id, ref_code and custom_code.",
                path=str(path),
                line=lineno,
            ) from None
        except (ValueError, RecursionError) as exc:  # an integer of thousands of digits; nesting too deep
            raise TaskError(f"not a JSON record this reader takes ({type(exc).__name__}: {exc}).",
                            path=str(path), line=lineno) from None
        if not isinstance(record, dict):
            raise TaskError("each line must be a JSON object.", path=str(path), line=lineno)
        missing = [k for k in ("level_id", "task_id", "ref_code") if k not in record]
        if "custom_code" not in record:
            missing.append("custom_code")
        if missing:
            raise TaskError(
                f"missing field(s) {', '.join(missing)}. Each record needs level_id, task_id, ref_code "
                "and custom_code (null when there is no candidate).",
                path=str(path),
                line=lineno,
            )
        level, number = _whole(record["level_id"]), _whole(record["task_id"])
        if not all(type(v) is int and 0 <= v < 2**31 for v in (level, number)):
            raise TaskError("level_id and task_id must be integers from 0 to 2**31 - 1.", path=str(path),
                            line=lineno)
        if not isinstance(record["ref_code"], str) or not record["ref_code"].strip():
            raise TaskError("ref_code must be a non-empty string.", path=str(path), line=lineno)
        candidate = None if _missing_candidate(record["custom_code"]) else record["custom_code"]
        if candidate is not None and not isinstance(candidate, str):
            raise TaskError("custom_code must be a string or null.", path=str(path), line=lineno)
        for field_name, code in (("ref_code", record["ref_code"]), ("custom_code", candidate)):
            if code is not None and has_surrogate(code):
                raise TaskError(f"{field_name} holds a lone surrogate (a \\ud800-style escape): not text that "
                                "can be stored or compiled.", path=str(path), line=lineno)
        origin = f"{path}:{lineno}"
        name = encodable(str(record.get("task_name") or record.get("name") or f"{number}"))
        task = make_task(record["ref_code"], name=name, level=level, origin=origin, number=number)
        rest = {k: v for k, v in record.items() if k not in ("ref_code", "custom_code")}
        records.append(SolutionRecord(task=task, candidate=candidate, line=lineno, claims=_claims(record), record=rest))
    if not records:
        raise TaskError("no records found; expected one JSON object per line.", path=str(path))
    return records


def parse_levels(text: str | None) -> set[int] | None:
    """'1,2' -> {1, 2}; None or '' -> None (all levels)."""
    if not text:
        return None
    try:
        levels = {int(part) for part in text.replace(" ", "").split(",") if part}
    except ValueError:
        levels = set()
    if not levels:  # ",,," meant every level
        raise UserError(f"--levels takes comma-separated integers such as 1,2 (got {text!r}).") from None
    return levels


def _dedupe(tasks: Iterable[Task]) -> list[Task]:
    seen: set[str] = set()
    out = []
    for task in tasks:
        if task.id not in seen:
            seen.add(task.id)
            out.append(task)
    return out


def load_tasks(source: str, levels: set[int] | None = None, ids: Iterable[str] | None = None) -> list[Task]:
    """Load tasks from `builtin`, a directory, a `.py` file or a `.jsonl` solution set, then filter."""
    if source == BUILTIN or source.startswith(BUILTIN + ":"):
        sizes = source.partition(":")[2] or CPU
        if sizes not in SIZES:
            raise TaskError(f"the built-in suite comes in sizes {', '.join(SIZES)} (builtin:cpu, builtin:gpu).",
                            path=source)
        tasks = load_builtin(sizes)
    else:
        path = Path(source)
        if path.is_dir():
            tasks = load_directory(path)
        elif path.suffix == ".jsonl":
            tasks = _dedupe(r.task for r in load_solutions_jsonl(path))
        elif path.is_file():
            tasks = [load_task_file(path)]
        else:
            raise TaskError(
                "no such file or directory. SOURCE is 'builtin', a KernelBench-layout directory, a task .py "
                "file or a .jsonl solution set.",
                path=source,
            )
    if levels:
        tasks = [t for t in tasks if t.level in levels]
    if ids:
        tasks = [find_task(tasks, selector) for selector in ids]
    return tasks


def _matches(task: Task, selector: str) -> bool:
    s = selector.strip()
    low = s.lower()
    if low == task.name.lower() or low == task.key.lower():
        return True
    if len(s) >= 4 and task.id.startswith(low):
        return True
    match = re.match(r"^(?:l|level)?(\d+)[/:_-](\d+)$", low)
    if match and task.number is not None:
        return int(match.group(1)) == task.level and int(match.group(2)) == task.number
    return False


def find_task(tasks: list[Task], selector: str) -> Task:
    """Find a task by id (or a prefix of 4+ digits), name, key 'L1/19_ReLU', or 'level/number' ('1/19')."""
    found = [t for t in tasks if _matches(t, selector)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise UserError(
            f"no task matches {selector!r}. Use an id (or its first 4+ characters), a name such as "
            "'19_ReLU', or level/number such as '1/19'; `cuda-l1 tasks list SOURCE` lists them."
        )
    names = ", ".join(f"{t.id} ({t.key})" for t in found[:8])
    raise UserError(f"{selector!r} is ambiguous: it matches {names}. Give more of the id.")


def no_task_matched(source: str, levels: set[int] | None) -> UserError:
    """The error for a selection that leaves nothing to do, naming what there was to choose from."""
    if not levels:
        return UserError("no task found.", path=source)
    present = sorted({t.level for t in load_tasks(source)})
    wanted = ",".join(str(level) for level in sorted(levels))
    return UserError(f"no task matched --levels {wanted}; the levels here are "
                     f"{', '.join(str(level) for level in present) or 'none'}.", path=source)


def select_tasks(source: str, levels: set[int] | None, limit: int | None = None) -> list[Task]:
    """The tasks of a source after --levels and a task limit; a UserError when none is left."""
    tasks = load_tasks(source, levels=levels)
    if limit is not None:
        tasks = first_tasks(tasks, limit)
    if not tasks:
        raise no_task_matched(source, levels)
    return tasks


def first_tasks(tasks: list[Task], limit: int) -> list[Task]:
    """The first `limit` distinct tasks, in order."""
    seen: dict[str, Task] = {}
    for task in tasks:
        if len(seen) >= limit:
            break
        seen.setdefault(task.id, task)
    return list(seen.values())
