"""Which compiler and linker flags an untrusted `load_inline` call may pass.

The flags come from LLM-written code but the compilers run in trusted code, so the policy is
default-deny: a flag is accepted only when it matches a known-harmless family (optimisation, code
generation, language standard, macros, warnings, sane GPU architectures, include paths inside the
toolchain, a small list of libraries). Anything that could run another program, load a plugin, read
a file of the caller's choosing or write outside the build directory is refused with `BuildError`:
`-fplugin`, `-B`, `-wrapper`, `-specs`, `-ccbin`, `-Wl,`/`-Xlinker`, `@responsefile`, `-o`,
`-save-temps`, `--output-directory`, `-include /abs/path`, `-I /home/...` and so on. nvcc flags
must also be free of shell syntax, because nvcc pastes them into shell commands.

Each list element may hold several flags separated by spaces (stock `load_inline` pastes them into
a shell command); they are split with shell rules but never run through a shell here.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cuda_l1.evaluate.build import flag_rules as rules
from cuda_l1.evaluate.build.build_errors import BuildError

@dataclass(frozen=True)
class CheckedFlags:
    """Flags that passed the policy, split by where they go."""

    compile: tuple[str, ...]  # flags for the compiler that was checked (c++ or nvcc)
    link: tuple[str, ...]  # -l/-L/-pthread/-fopenmp found among them, moved to the link step


def split_flags(flags: Iterable[str] | str | None, where: str) -> list[str]:
    """Flatten a flag list whose elements may hold several shell-quoted flags."""
    if flags is None:
        return []
    if isinstance(flags, str):
        flags = [flags]
    out: list[str] = []
    for element in flags:
        if not isinstance(element, str):
            raise BuildError(f"{where}: every flag must be a string, got {type(element).__name__}.")
        try:
            out.extend(shlex.split(element))
        except ValueError as exc:
            raise BuildError(f"{where}: cannot split flag {element!r}: {exc}.") from None
    if len(out) > rules.MAX_FLAGS:
        raise BuildError(f"{where}: {len(out)} flags given; at most {rules.MAX_FLAGS} are accepted.")
    for token in out:
        if len(token) > rules.MAX_FLAG_CHARS or any(c in token for c in "\n\r\0"):
            raise BuildError(f"{where}: flag {token[:60]!r}... is too long or holds a control character.")
    return out


def _refuse(where: str, flag: str, why: str) -> BuildError:
    return BuildError(f"{where}: flag {flag!r} is not allowed ({why}).")


def _denied_reason(flag: str) -> str | None:
    if flag in rules.OUTPUT_FLAGS:
        return "inputs and outputs are chosen by the build"
    for prefix, why in rules.DENIED:
        if flag.startswith(prefix) and not (prefix == "-dc" and flag != "-dc"):
            return why
    return None


def check_path(path: str, roots: Sequence[str], where: str, what: str = "include path") -> str:
    """Accept a relative path without `..` (it resolves inside the build directory) or an absolute
    one inside a trusted toolchain root; refuse everything else."""
    if not path or "\0" in path:
        raise BuildError(f"{where}: empty or invalid {what}.")
    if not os.path.isabs(path):
        parts = path.replace("\\", "/").split("/")
        if ".." in parts or path.startswith("~"):
            raise BuildError(f"{where}: {what} {path!r} leaves the build directory.")
        return path
    real = os.path.realpath(path)
    for root in roots:
        root_real = os.path.realpath(root)
        if real == root_real or real.startswith(root_real.rstrip("/") + "/"):
            return path
    raise BuildError(f"{where}: {what} {path!r} is outside the toolchain directories; "
                     "only the torch, CUDA, Python and system include/library directories may be named.")


def _check_lib(name: str, where: str) -> str:
    if name not in rules.ALLOWED_LIBS:
        raise BuildError(f"{where}: library {name!r} is not in the allowed list "
                         f"({', '.join(sorted(rules.ALLOWED_LIBS))}).")
    return f"-l{name}"


def _take_value(tokens: list[str], i: int, flag: str, where: str) -> tuple[str, int]:
    """The value of `flag` at tokens[i]: attached (`-Ifoo`, `--opt=foo`) or the next token."""
    token = tokens[i]
    if token.startswith(flag + "="):
        return token[len(flag) + 1:], i + 1
    if token != flag:
        return token[len(flag):], i + 1
    if i + 1 >= len(tokens):
        raise BuildError(f"{where}: flag {flag!r} needs a value.")
    return tokens[i + 1], i + 2


def _check_cxx_tokens(tokens: list[str], where: str, inc_roots: Sequence[str],
                      lib_roots: Sequence[str]) -> CheckedFlags:
    comp: list[str] = []
    link: list[str] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.startswith(("-isystem", "-iquote", "-idirafter")):
            flag = next(f for f in ("-isystem", "-iquote", "-idirafter") if t.startswith(f))
            value, i = _take_value(tokens, i, flag, where)
            comp += [flag, check_path(value, inc_roots, where)]
            continue
        if t.startswith(("-include", "-imacros")):
            flag = "-include" if t.startswith("-include") else "-imacros"
            value, i = _take_value(tokens, i, flag, where)
            comp += [flag, check_path(value, (), where, "forced include")]
            continue
        if t.startswith("-I"):
            value, i = _take_value(tokens, i, "-I", where)
            comp.append("-I" + check_path(value, inc_roots, where))
            continue
        if t.startswith("-L"):
            value, i = _take_value(tokens, i, "-L", where)
            link.append("-L" + check_path(value, lib_roots, where, "library path"))
            continue
        if t.startswith("-l"):
            value, i = _take_value(tokens, i, "-l", where)
            link.append(_check_lib(value, where))
            continue
        if t in ("-D", "-U"):
            value, i = _take_value(tokens, i, t, where)
            t = t + value
        else:
            i += 1
        why = _denied_reason(t)
        if why:
            raise _refuse(where, t, why)
        if rules.MACRO.match(t) or rules.CXX_PLAIN.match(t) or rules.CXX_F.match(t) or rules.CXX_M.match(t) or rules.CXX_W.match(t):
            if t in ("-fopenmp", "-pthread"):
                link.append(t)
            comp.append(t)
            continue
        raise _refuse(where, t, "not in the list of accepted C++ compiler flags")
    return CheckedFlags(tuple(comp), tuple(link))


def check_cxx_flags(flags, *, where: str = "extra_cflags", include_roots: Sequence[str] = (),
                    lib_roots: Sequence[str] = ()) -> CheckedFlags:
    """Check host C++ compiler flags (`extra_cflags`, and what nvcc passes on with -Xcompiler)."""
    return _check_cxx_tokens(split_flags(flags, where), where, include_roots, lib_roots)


def _check_ptxas(value: str, where: str) -> None:
    for part in value.split(","):
        if part and not rules.PTXAS_OK.match(part):
            raise _refuse(where, f"-Xptxas {part}", "not in the list of accepted ptxas options")


def _check_arch(value: str, where: str, flag: str) -> None:
    values = value.strip("\"'[]").split(",")
    if flag in ("-arch", "--gpu-architecture") and values == ["native"]:
        return
    for v in values:
        if not rules.ARCH_RE.match(v):
            raise _refuse(where, f"{flag} {value}", "not a known GPU architecture")


def check_nvcc_flags(flags, *, where: str = "extra_cuda_cflags", include_roots: Sequence[str] = (),
                     lib_roots: Sequence[str] = ()) -> CheckedFlags:
    """Check nvcc flags; host flags behind -Xcompiler go through the C++ policy."""
    tokens = split_flags(flags, where)
    comp: list[str] = []
    link: list[str] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        name = t.split("=", 1)[0]
        if rules.NVCC_PLAIN.match(t):  # first: -lineinfo is not a library, -G not a path
            comp.append(t)
            i += 1
            continue
        if name in ("-Xcompiler", "--compiler-options"):
            value, i = _take_value(tokens, i, name, where)
            host = [v.strip("\"'") for v in value.split(",") if v.strip("\"'")]
            checked = _check_cxx_tokens(host, where + " (-Xcompiler)", include_roots, lib_roots)
            if checked.compile:
                comp += ["-Xcompiler", ",".join(checked.compile)]
            link += checked.link
            continue
        if name in ("-Xptxas", "--ptxas-options"):
            value, i = _take_value(tokens, i, name, where)
            _check_ptxas(value.strip("\"'"), where)
            comp += ["-Xptxas", value.strip("\"'")]
            continue
        if name == "-Xcudafe":
            value, i = _take_value(tokens, i, name, where)
            if not rules.CUDAFE_OK.match(value.strip("\"'")):
                raise _refuse(where, f"-Xcudafe {value}", "only --diag_suppress is accepted")
            comp += ["-Xcudafe", value.strip("\"'")]
            continue
        if name in ("-arch", "--gpu-architecture", "-code", "--gpu-code"):
            value, i = _take_value(tokens, i, name, where)
            value = value.strip("\"'")
            _check_arch(value, where, name)
            comp.append(f"{name}={value}")
            continue
        if name in ("-gencode", "--generate-code"):
            value, i = _take_value(tokens, i, name, where)
            value = value.strip("\"'")
            if not rules.GENCODE.match(value):
                raise _refuse(where, f"{name} {value}", "not a known GPU architecture pair")
            comp.append(f"-gencode={value}")
            continue
        if name in ("-maxrregcount", "--maxrregcount", "-t", "--threads", "--split-compile",
                    "-split-compile"):
            value, i = _take_value(tokens, i, name, where)
            if not value.isdigit() or int(value) > 1024:
                raise _refuse(where, f"{name} {value}", "needs a small integer")
            canonical = {"-t": "--threads", "-split-compile": "--split-compile",
                         "--maxrregcount": "-maxrregcount"}.get(name, name)
            comp.append(f"{canonical}={value}")
            continue
        if name in ("-std", "--std"):
            value, i = _take_value(tokens, i, name, where)
            if not re.fullmatch(r"c\+\+(11|14|17|20|23)", value):
                raise _refuse(where, f"{name}={value}", "unknown language standard")
            comp.append(f"-std={value}")
            continue
        if name.lstrip("-") in rules.BOOL_OPTS and name.startswith("-"):
            value, i = _take_value(tokens, i, name, where)
            if value not in ("true", "false"):
                raise _refuse(where, f"{name}={value}", "needs true or false")
            comp.append(f"--{name.lstrip('-')}={value}")
            continue
        if name in ("--default-stream", "-default-stream"):
            value, i = _take_value(tokens, i, name, where)
            if value not in ("legacy", "null", "per-thread"):
                raise _refuse(where, f"{name} {value}", "unknown stream mode")
            comp.append(f"--default-stream={value}")
            continue
        if name in ("--diag-suppress", "-diag-suppress", "--Werror", "-Werror"):
            value, i = _take_value(tokens, i, name, where)
            if not re.fullmatch(r"[\w,-]{1,200}", value):
                raise _refuse(where, f"{name} {value}", "unexpected value")
            comp.append(f"{name}={value}")
            continue
        if name in ("-Ofast-compile", "--Ofast-compile", "-Ofc"):
            value, i = _take_value(tokens, i, name, where)
            if value not in ("max", "mid", "min", "0"):
                raise _refuse(where, f"{name} {value}", "unknown level")
            comp.append(f"-Ofc={value}")
            continue
        if t.startswith(("-I", "-isystem", "-D", "-U", "-L", "-l", "-O", "-include")):
            # Shared with the host policy; a bare flag takes its value from the next token.
            width = 2 if t in rules.VALUE_FLAGS else 1
            checked = _check_cxx_tokens(tokens[i:i + width], where, include_roots, lib_roots)
            i += width
            bad = [f for f in checked.compile if f.startswith("-O") and f not in ("-O0", "-O1", "-O2", "-O3")]
            if bad:
                raise _refuse(where, bad[0], "nvcc accepts only -O0..-O3")
            comp += checked.compile
            link += checked.link
            continue
        i += 1
        why = _denied_reason(t)
        if why:
            raise _refuse(where, t, why)
        raise _refuse(where, t, "not in the list of accepted nvcc flags")
    for token in comp:
        if not rules.SHELL_SAFE.match(token):
            raise _refuse(where, token, "spaces, quotes and shell characters are not accepted in nvcc flags")
    return CheckedFlags(tuple(comp), tuple(link))


def check_shell_safe(value: str, where: str, what: str) -> str:
    """Refuse a value (an include path) that would reach nvcc's shell with shell syntax in it."""
    if not rules.SHELL_SAFE.match(value):
        raise BuildError(f"{where}: {what} {value!r} holds spaces, quotes or shell characters.")
    return value


_LD_PLAIN = re.compile(r"-(pthread|fopenmp|shared|fPIC|s|O[0-3]|Wl,--(no-)?as-needed|Wl,-O[0-3])\Z")


def check_ldflags(flags, *, where: str = "extra_ldflags", lib_roots: Sequence[str] = ()) -> tuple[str, ...]:
    """Check linker flags: allowed libraries by name, library paths inside the toolchain."""
    tokens = split_flags(flags, where)
    out: list[str] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.startswith("-l"):
            value, i = _take_value(tokens, i, "-l", where)
            out.append(_check_lib(value, where))
            continue
        if t.startswith("-L"):
            value, i = _take_value(tokens, i, "-L", where)
            out.append("-L" + check_path(value, lib_roots, where, "library path"))
            continue
        i += 1
        if _LD_PLAIN.match(t):
            out.append(t)
            continue
        why = _denied_reason(t)
        raise _refuse(where, t, why or "not in the list of accepted linker flags")
    return tuple(out)


def names_gpu_arch(nvcc_flags: Sequence[str]) -> bool:
    """True when the candidate chose its own GPU architecture (then no default arch is added)."""
    return any(f.startswith(("-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code",
                             "--gpu-code")) for f in nvcc_flags)
