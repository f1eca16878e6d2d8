"""Read a candidate's `load_inline(...)` calls from its source without running any of it.

    specs = static_specs(candidate_source)   # the extensions it will ask for, where knowable

Most candidates pass string constants defined at module level (`cuda_src = \"\"\"...\"\"\"`), so
the arguments of their build call can be worked out from the syntax tree alone. That lets the
trusted side compile them on spare CPU cores before the candidate reaches a GPU worker; when the
child later asks for the build, it is a cache hit.

Only literals, names bound once at module level to such values, `+` of strings or lists, and
f-strings of those are understood; anything else (a call, an attribute, a name bound twice) makes
the whole call unknown and it is skipped. A wrong guess costs one unused build, never a wrong
result: the child's real request is validated and built by the same trusted code as always.
"""

from __future__ import annotations

import ast
import json

from cuda_l1.evaluate.build.build_errors import BuildError
from cuda_l1.evaluate.build.spec import ExtensionSpec

MAX_CALLS = 8  # a source asking for more extensions than this gets only the first ones ahead


class _Unknown(Exception):
    """The value cannot be known without running code."""


def _module_constants(tree: ast.Module) -> dict[str, ast.expr]:
    """Names bound exactly once in the whole module, by a plain `name = value` at the top level."""
    bound: dict[str, int] = {}
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
            targets = [node.target]
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            targets = [node.target]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] = bound.get(node.name, 0) + 1
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = (alias.asname or alias.name).split(".")[0]
                bound[name] = bound.get(name, 0) + 1
        elif isinstance(node, ast.Global):
            for name in node.names:
                bound[name] = bound.get(name, 0) + 2  # rebound from inside a function: never constant
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    bound[leaf.id] = bound.get(leaf.id, 0) + 1
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if bound.get(name) == 1:
                constants[name] = node.value
    return constants


class _Evaluator:
    def __init__(self, constants: dict[str, ast.expr]):
        self.constants = constants
        self.active: set[str] = set()  # names being resolved (a = b; b = a)

    def value(self, node: ast.expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bool, int, float, type(None))):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(item) for item in node.elts]
        if isinstance(node, ast.Dict):
            if any(key is None for key in node.keys):
                raise _Unknown("dict unpacking")
            return {self.value(k): self.value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.Name):
            if node.id not in self.constants or node.id in self.active:
                raise _Unknown(node.id)
            self.active.add(node.id)
            try:
                return self.value(self.constants[node.id])
            finally:
                self.active.discard(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.value(node.left), self.value(node.right)
            if isinstance(left, str) and isinstance(right, str) or isinstance(left, list) and isinstance(right, list):
                return left + right
            raise _Unknown("+ of mixed types")
        if isinstance(node, ast.JoinedStr):
            parts = []
            for part in node.values:
                if isinstance(part, ast.Constant):
                    parts.append(str(part.value))
                elif isinstance(part, ast.FormattedValue) and part.conversion == -1 and part.format_spec is None:
                    inner = self.value(part.value)
                    if not isinstance(inner, (str, int)) or isinstance(inner, bool):
                        raise _Unknown("f-string of a non-string")
                    parts.append(str(inner))
                else:
                    raise _Unknown("formatted f-string field")
            return "".join(parts)
        raise _Unknown(type(node).__name__)


def _load_inline_names(tree: ast.Module) -> set[str]:
    """Local names under which `load_inline` may be called (`from ... import load_inline as li`)."""
    names = {"load_inline"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == "load_inline" and alias.asname:
                    names.add(alias.asname)
    return names


def _is_load_inline(func: ast.expr, names: set[str]) -> bool:
    if isinstance(func, ast.Name):
        return func.id in names
    return isinstance(func, ast.Attribute) and func.attr == "load_inline"


def static_specs(source: str) -> list[ExtensionSpec]:
    """The extension specs of `source`'s `load_inline` calls whose arguments are knowable statically.

    Never raises for bad input: a source that does not parse, or whose calls are unknowable or
    would be refused by the build policy, simply yields fewer (or no) specs.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    evaluator = _Evaluator(_module_constants(tree))
    names = _load_inline_names(tree)
    specs: list[ExtensionSpec] = []
    seen: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _is_load_inline(node.func, names)):
            continue
        try:
            if any(isinstance(arg, ast.Starred) for arg in node.args) or any(kw.arg is None for kw in node.keywords):
                raise _Unknown("*args or **kwargs")
            args = [evaluator.value(arg) for arg in node.args]
            kwargs = {kw.arg: evaluator.value(kw.value) for kw in node.keywords}
            spec = ExtensionSpec.from_load_inline_args(*args, **kwargs)
        except (_Unknown, BuildError, TypeError, ValueError, RecursionError):
            continue
        identity = json.dumps(spec.canonical(), sort_keys=True)
        if identity in seen:  # the same call in two branches builds once
            continue
        seen.add(identity)
        specs.append(spec)
        if len(specs) >= MAX_CALLS:
            break
    return specs
