"""The house rules a newcomer relies on, checked on the source: no import circles, nothing below
`cli/` imports it, no module over 400 lines, one meaning per module name."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "cuda_l1"
MAX_LINES = 400
# A package's own __init__ and __main__ are the only names allowed twice.
SHARED_NAMES = {"__init__", "__main__"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "builtin" in path.relative_to(PACKAGE).parts:  # task files of the built-in suite
            continue
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every project module `name` imports, at any depth of its code (function bodies included)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    # A package's __init__ re-exporting its own modules is not a circle through them.
    return {name: {t for t in _imports(name, path) if not t.startswith(name + ".")} for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, result, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    result.append(sorted(component))
    return result


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_nothing_below_the_cli_imports_it():
    offenders = sorted((name, target) for name, targets in _graph().items() for target in targets
                       if target.startswith("cuda_l1.cli") and not name.startswith("cuda_l1.cli")
                       and name != "cuda_l1.__main__")
    assert offenders == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_at_most_400_lines(name):
    lines = MODULES[name].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(SRC)} has {lines} lines"


def test_one_meaning_per_module_name():
    by_name = collections.defaultdict(list)
    for name, path in MODULES.items():
        by_name[path.stem].append(name)
    repeated = {stem: sorted(names) for stem, names in by_name.items() if len(names) > 1 and stem not in SHARED_NAMES}
    assert repeated == {}


def _readme_layout() -> str:
    text = (SRC.parent / "README.md").read_text(encoding="utf-8")
    start = text.index("```\nsrc/cuda_l1/")
    return text[start:text.index("```", start + 3)]


def test_readme_layout_names_only_modules_that_exist():
    import re

    stems = {path.stem for path in MODULES.values()}
    named = set(re.findall(r"\b([a-z][a-z_]*)\.py\b", _readme_layout()))
    assert sorted(named - stems) == []


def test_readme_layout_names_every_module_of_the_evaluator():
    layout = _readme_layout()
    evaluator = sorted(path.name for path in (PACKAGE / "evaluate").glob("*.py") if path.name != "__init__.py")
    assert [name for name in evaluator if name not in layout] == []


def test_a_worker_gets_its_configuration_without_importing_torch():
    """A spawned worker unpickles its configuration and imports the pool module before its first line
    runs; neither may import torch, so that the worker's fork server (which imports torch itself)
    starts at once and its import overlaps the worker's, instead of coming after it (about 5 s on an
    H200 host before the tolerance settings left precision.py)."""
    import pickle
    import subprocess
    import sys

    from cuda_l1.evaluate.config import EvalConfig

    blob = pickle.dumps(EvalConfig())
    code = ("import pickle, sys; pickle.loads(sys.stdin.buffer.read()); "
            "import cuda_l1.evaluate.local_pool, cuda_l1.evaluate.fork_server; "
            "print('torch' in sys.modules)")
    src = str(Path(__file__).resolve().parent.parent / "src")
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=60,
                         env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout.decode().strip() == "False", out.stdout.decode()
