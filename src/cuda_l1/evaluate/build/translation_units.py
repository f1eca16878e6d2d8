"""The text of the two translation units, built the way `load_inline` builds them.

`main.cpp` = `#include <torch/extension.h>` + cpp_sources + a generated pybind11 module;
`cuda.cu` = `#include <torch/types.h>`, `<cuda.h>`, `<cuda_runtime.h>` + cuda_sources.
Two departures, both invisible to code that compiles under stock `load_inline`:
- the implicit headers are passed as `-include` flags instead of being pasted into the file (same
  meaning: "as if #included on the first line"), so compiler messages count the candidate's own
  lines and the binding TU can take the precompiled header in their place;
- "slim" CUDA headers: a `.cu` that includes `<torch/extension.h>` but uses nothing beyond what
  `<torch/types.h>` declares gets `<torch/types.h>` instead. `extension.h` drags the whole C++
  frontend, pybind11 and Python.h through cudafe++, cicc and the host compiler: with nvcc 13.0,
  gcc 12 and torch 2.13, the one-kernel benchmark `.cu` took 53-55 s CPU as written and 22-24 s
  slim. (ATen/core/Tensor.h plus hand-made torch:: aliases would take 18.9 s, but that changes
  which `torch::` functions exist and how factories treat requires_grad, so it is not done.)
  If the slim text fails with a missing-name error the build retries with the text as written, so
  code that needs the full header still builds, only slower.

Safety checks for sources live here too: the compilers run in trusted code, so a source may not
include files by absolute or `..` path, compute its include names, or pull a file into the object
with the assembler's `.incbin`/`.include`.
"""

from __future__ import annotations

import re

from cuda_l1.evaluate.build.build_errors import BuildError

MAX_SOURCE_CHARS = 2_000_000  # all sources together; real candidates are a few KB

IMPLICIT_CPP_HEADER = "torch/extension.h"
IMPLICIT_CUDA_HEADERS = ("torch/types.h", "cuda.h", "cuda_runtime.h")

_HEAVY_INCLUDE = re.compile(r'^([ \t]*#[ \t]*include[ \t]*[<"]torch/(extension|torch|all|python)\.h[>"])(.*)$',
                            re.M)
# Names that only the full C++ frontend (torch/all.h) or pybind11/Python.h declare.
_NEEDS_FULL_TORCH = re.compile(
    r"\b(py|pybind11)\s*::|\bPYBIND11_|\bPy(_\w+|[A-Z][a-z]+_\w+|Object)\b|\bTHP\w*"
    r"|\bTORCH_(MODULE|VERSION)|\btorch\s*::\s*(nn|optim|data|jit|serialize|python|cuda|mps|xpu|fft"
    r"|linalg|special|nested|sparse|utils|autograd|enumtype|stable|NoGradGuard|AutoGradMode"
    r"|manual_seed|save|load|pickle_save|pickle_load|ordered_dict|OrderedDict)\b"
    r"|\b(nn|optim|fft|linalg|special|nested)\s*::|\bNoGradGuard\b|\bAutoGradMode\b|\bmanual_seed\b")
# Compiler messages that a missing declaration produces (gcc and EDG/nvcc wordings).
MISSING_NAME = re.compile(
    r"has no member|is undefined|was not declared|is not a member of|has not been declared"
    r"|does not name a type|must be a class or namespace name|not a class or namespace|incomplete type")

_INCLUDE_LIKE = re.compile(r"^[ \t]*#[ \t]*(include_next|include|import|embed)\b[ \t]*(.*)$", re.M)
_HAS_INCLUDE = re.compile(r"__has_(include_next|include|embed)\s*\(\s*([^)]*)\)")
_PRAGMA_DEPENDENCY = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+GCC[ \t]+dependency[ \t]+(.*)$", re.M)
_ASM_FILE_DIRECTIVE = re.compile(r"\.\s*(incbin|include)\b", re.I)
_IDENT = re.compile(r"[A-Za-z_]\w*\Z")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_PYBIND_MODULE = re.compile(r"PYBIND11_MODULE\s*\(\s*([A-Za-z_]\w*)\s*,")


def _check_include_target(arg: str, where: str, directive: str) -> None:
    arg = arg.strip()
    if not arg or arg[0] not in "<\"":
        raise BuildError(f"{where}: `{directive} {arg[:60]}` computes its file name from a macro; "
                         "only literal <...> or \"...\" names are accepted.")
    name = arg[1:].split(">" if arg[0] == "<" else '"', 1)[0]
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "~")) or ".." in parts:
        raise BuildError(f"{where}: `{directive} {arg[:80]}` names a file outside the include path; "
                         "absolute and `..` include paths are not accepted.")


def check_source(text: str, where: str) -> None:
    """Refuse source constructs that read files outside the include path at compile time."""
    joined = text.replace("\\\r\n", "").replace("\\\n", "")
    for m in _INCLUDE_LIKE.finditer(joined):
        _check_include_target(m.group(2), where, "#" + m.group(1))
    for m in _HAS_INCLUDE.finditer(joined):
        _check_include_target(m.group(2), where, "__has_" + m.group(1))
    for m in _PRAGMA_DEPENDENCY.finditer(joined):
        _check_include_target(m.group(1), where, "#pragma GCC dependency")
    # Adjacent string literals and token pasting can spell the directive in pieces.
    squashed = re.sub(r'"\s*"', "", joined)
    squashed = re.sub(r"\s*##\s*", "", squashed)
    if _ASM_FILE_DIRECTIVE.search(squashed):
        raise BuildError(f"{where}: assembler `.incbin`/`.include` directives are not accepted "
                         "(they read arbitrary files while compiling).")


def is_identifier(name: str) -> bool:
    return bool(_IDENT.match(name))


def declared_module_name(texts) -> str | None:
    """A module name the sources hard-code with PYBIND11_MODULE(name, m), if any."""
    for text in texts:
        for m in _PYBIND_MODULE.finditer(text):
            if m.group(1) != "TORCH_EXTENSION_NAME":
                return m.group(1)
    return None


def _cpp_string(text: str) -> str:
    """A C++ string literal for `text`; octal escapes never swallow the following character."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in "\\\"":
            out.append("\\" + ch)
        elif 32 <= code < 127:
            out.append(ch)
        else:
            out.extend(f"\\{b:03o}" for b in ch.encode("utf-8"))
    return '"' + "".join(out) + '"'


def module_definition(functions, with_error_handling: bool) -> str:
    """The PYBIND11_MODULE block load_inline generates for `functions` ((name, doc) pairs)."""
    lines = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    for name, doc in functions:
        target = f"torch::wrap_pybind_function({name})" if with_error_handling else name
        lines.append(f"m.def({_cpp_string(name)}, {target}, {_cpp_string(doc)});")
    lines.append("}")
    return "\n".join(lines)


def cpp_translation_unit(cpp_sources, functions, with_error_handling: bool) -> str:
    """main.cpp: the candidate's C++ sources and, when `functions` is given, the module block."""
    parts = list(cpp_sources)
    if functions is not None:
        parts.append(module_definition(functions, with_error_handling))
    return "\n".join(parts) + "\n"


def slim_cuda_text(text: str) -> tuple[str, bool]:
    """Swap heavy torch includes for <torch/types.h> when nothing needs the full frontend.
    Line count is kept so messages point at the same lines."""
    code = _COMMENT.sub(" ", text)  # "PyTorch" in a comment must not keep the heavy header
    if not _HEAVY_INCLUDE.search(text) or _NEEDS_FULL_TORCH.search(code):
        return text, False
    slim = _HEAVY_INCLUDE.sub(lambda m: "#include <torch/types.h>" + m.group(3) + "  // slimmed: " +
                              m.group(2) + ".h", text)
    return slim, True


def cuda_translation_unit(cuda_sources, slim: bool) -> tuple[str, bool]:
    """cuda.cu and whether its torch headers were slimmed."""
    body = "\n".join(cuda_sources)
    slimmed = False
    if slim:
        body, slimmed = slim_cuda_text(body)
    return body + "\n", slimmed
