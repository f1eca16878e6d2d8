"""A static scan of candidate source: an extra signal in `checks`, never the verdict.

Runtime checks decide (a pattern in text proves nothing: streams can be legitimate, and a determined
candidate can hide anything from a regex). The scan exists so a human reading a verdict, or a reward
model, sees at a glance which suspicious mechanisms a kernel reaches for.
"""

from __future__ import annotations

import ast
import bisect
import itertools
import re

_PATTERNS: dict[str, list[str]] = {
    "side streams": [r"torch\.cuda\.Stream\b", r"cudaStreamCreate", r"\.Stream\(", r"getStreamFromPool",
                     r"cudaStreamNonBlocking"],
    "threads or processes": [r"\bthreading\b", r"\bThread\(", r"concurrent\.futures", r"\bmultiprocessing\b",
                             r"os\.fork\b", r"\bsubprocess\b", r"std::thread", r"pthread_create", r"os\.system"],
    "low-level memory access": [r"\bctypes\b", r"\bcffi\b", r"\bmmap\b", r"cudaIpc"],
    "harness inspection": [r"\bexec\(", r"\bcompile\([^)\n]{0,200}exec", r"sys\._getframe", r"\bgc\.get_objects", r"\binspect\.(stack|currentframe)",
                           r"sys\.modules", r"__builtins__", r"cuda_l1", r"/proc/self"],
    "environment or files": [r"os\.environ", r"\bgetenv\b", r"\bopen\(\s*['\"]/", r"\bsocket\b", r"\burllib\b",
                             r"\brequests\b", r"\bhttp\.client\b"],
    "precision downgrade": [r"\.half\(\)", r"float16", r"bfloat16", r"allow_tf32", r"autocast",
                            r"set_float32_matmul_precision", r"__half\b", r"__nv_bfloat16", r"\btf32\b",
                            # integer and 8-bit float arithmetic: quantised weights or activations
                            r"\bq(u)?int8\b", r"quantize_(per|dynamic)", r"torch\.ops\.quantized", r"\btorch\.ao\b",
                            r"_int_mm\b", r"_scaled_mm\b", r"float8_", r"__nv_fp8", r"__dp4a\b"],
    "output caching": [r"data_ptr\(\)", r"lru_cache", r"functools\.cache\b", r"_cache\s*=\s*\{\}",
                       r"cached_output", r"memo(?!ry)"],
}
# The scan runs in the parent, holding the GIL, before the evaluation's deadline: its time is bounded. Every
# pattern is linear in the text (a span with no bound, `compile\([^)]*exec`, took 12 s over a 256 KB line
# of `compile(` repeated, quadratically more as it grew), and what it reads is capped: real kernels'
# sources are tens of KB (CUDA-L1's H100 release: 27 KB at the most).
_HITS = 8  # lines named per category
SCAN_CHARS = 256 << 10  # of a source, the most searched by the patterns (about 0.25 s at the worst)
PARSE_CHARS = 64 << 10  # ... and parsed for patching: CPython's parser is quadratic on some text (a 1 MiB
# f-string of {a} fields took 93 s; 64 KiB, 0.6 s)

_GUARDED_MODULES = {"torch", "time", "builtins", "os", "threading", "F", "nn", "random", "numpy", "np"}


def _patching(tree: ast.AST) -> list[str]:
    """Assignments to attributes of torch/time/builtins (monkeypatching), and setattr on them."""
    found = []
    for node in ast.walk(tree):
        if len(found) >= _HITS:  # enough to name it (unparsing every one of 60000 took seconds)
            break
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            root = target
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(target, ast.Attribute) and isinstance(root, ast.Name) and root.id in _GUARDED_MODULES:
                found.append(f"line {node.lineno}: assigns {ast.unparse(target)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if node.args and isinstance(node.args[0], (ast.Name, ast.Attribute)):
                root = node.args[0]
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in _GUARDED_MODULES:
                    found.append(f"line {node.lineno}: {node.func.id} on {ast.unparse(node.args[0])}")
    return found


def scan(source: str) -> dict[str, list[str]]:
    """Suspicious mechanisms found in the source, by category (empty categories omitted). Only its first
    SCAN_CHARS are searched and PARSE_CHARS parsed (the side's own load of a longer source is under the
    evaluation's deadline); a longer one is named ("size")."""
    findings: dict[str, list[str]] = {}
    if len(source) > PARSE_CHARS:
        findings["size"] = [f"{len(source) / 1024:.0f} KiB of source; its first {SCAN_CHARS >> 10} KiB searched, "
                            f"{PARSE_CHARS >> 10} KiB parsed"]
    parse_text = source[:PARSE_CHARS]
    source = source[:SCAN_CHARS]
    lines: list[str] = []
    starts: list[int] = []  # offset of each line's start, made at the first hit
    for category, patterns in _PATTERNS.items():
        hit_lines: set[int] = set()
        for pattern in patterns:
            # Over the whole text in one pass (a loop over lines ran every pattern once a line: 45 s for a
            # million short lines); the first hits of each pattern are enough to name the category.
            for count, match in enumerate(re.finditer(pattern, source)):
                if count == _HITS:
                    break
                if not starts:
                    lines = source.split("\n")
                    starts = list(itertools.accumulate((len(line) + 1 for line in lines[:-1]), initial=0))
                hit_lines.add(bisect.bisect_right(starts, match.start()))
        if hit_lines:
            findings[category] = [f"line {n}: {lines[n - 1].strip()[:120]}" for n in sorted(hit_lines)[:_HITS]]
    try:  # a source too deep for the parser (a chain of thousands of operators) is judged, not a crash
        patches = _patching(ast.parse(parse_text))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        patches = []
    if patches:
        findings["monkeypatching"] = patches[:_HITS]
    return findings


def summary(findings: dict[str, list[str]]) -> str:
    if not findings:
        return "nothing suspicious found"
    return "; ".join(f"{cat}: {len(hits)} ({hits[0]})" for cat, hits in findings.items())
