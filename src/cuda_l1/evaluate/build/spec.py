"""`ExtensionSpec`: everything a `load_inline(...)` call says that changes the built library.

The evaluator intercepts a candidate's `torch.utils.cpp_extension.load_inline(...)` call and turns
its arguments into a spec with `ExtensionSpec.from_load_inline_args(*args, **kwargs)`; the spec is
checked at construction (names, sizes, flags, source constructs), so an accepted spec is safe to
hand to the compilers. Arguments that only steer stock torch's own build (`build_directory`,
`verbose`, `keep_intermediates`, `use_pch`, `extra_sycl_cflags`) are accepted and ignored.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import asdict, dataclass

from cuda_l1.evaluate.build import flags as flag_policy
from cuda_l1.evaluate.build.build_errors import BuildError
from cuda_l1.evaluate.build.translation_units import MAX_SOURCE_CHARS, check_source, is_identifier
from cuda_l1.evaluate.build.toolchain import trusted_roots

MAX_FUNCTIONS = 256
_FUNCTION_NAME = re.compile(r"(::)?[A-Za-z_]\w*(::[A-Za-z_]\w*)*\Z")


def _load_inline_signature(name, cpp_sources, cuda_sources=None, sycl_sources=None, functions=None,
                           extra_cflags=None, extra_cuda_cflags=None, extra_sycl_cflags=None,
                           extra_ldflags=None, extra_include_paths=None, build_directory=None,
                           verbose=False, with_cuda=None, with_sycl=None, is_python_module=True,
                           with_pytorch_error_handling=True, keep_intermediates=True, use_pch=False,
                           no_implicit_headers=False):
    """Mirror of torch.utils.cpp_extension.load_inline's parameters (torch 2.11 - 2.13)."""


_SIGNATURE = inspect.signature(_load_inline_signature)


def _sources(value, what: str, required: bool) -> tuple[str, ...]:
    if value is None:
        if required:
            raise BuildError(f"load_inline: {what} is required (a string or a list of strings).")
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise BuildError(f"load_inline: {what} must be a string or a list of strings, "
                     f"got {type(value).__name__}.")


def _flag_list(value, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(v.strip() for v in value)
    raise BuildError(f"load_inline: {what} must be a list of strings, got {type(value).__name__}.")


def _functions(value) -> tuple[tuple[str, str], ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if isinstance(value, (list, tuple)):
        if not all(isinstance(v, str) for v in value):
            raise BuildError("load_inline: functions must hold function names (strings).")
        pairs = tuple((v, v) for v in value)
    elif isinstance(value, dict):
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise BuildError("load_inline: functions must map names to docstrings (strings).")
        pairs = tuple(value.items())
    else:
        raise BuildError(f"load_inline: functions must be a list or dict, got {type(value).__name__}.")
    return pairs


def _bool(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise BuildError(f"load_inline: {what} must be True or False, got {value!r}.")
    return value


_TEXT_TUPLES = ("cpp_sources", "cuda_sources", "extra_cflags", "extra_cuda_cflags", "extra_ldflags",
                "extra_include_paths")
_BOOLS = ("with_cuda", "with_pytorch_error_handling", "is_python_module", "no_implicit_headers")


@dataclass(frozen=True)
class ExtensionSpec:
    """One extension to build, normalised from load_inline's arguments."""

    name: str  # the module name the candidate asked for (made unique per build key)
    cpp_sources: tuple[str, ...]  # C++ sources, joined into main.cpp after torch/extension.h
    cuda_sources: tuple[str, ...] = ()  # CUDA sources, joined into cuda.cu
    functions: tuple[tuple[str, str], ...] | None = None  # (name, docstring) pairs to bind
    extra_cflags: tuple[str, ...] = ()  # host C++ compiler flags (policy-checked)
    extra_cuda_cflags: tuple[str, ...] = ()  # nvcc flags (policy-checked)
    extra_ldflags: tuple[str, ...] = ()  # linker flags (policy-checked)
    extra_include_paths: tuple[str, ...] = ()  # -I directories (toolchain dirs or relative only)
    with_cuda: bool = False  # compile cuda.cu with nvcc and link the CUDA torch libraries
    with_pytorch_error_handling: bool = True  # bind through torch::wrap_pybind_function
    is_python_module: bool = True  # import as a module (else load as a plain library of ops)
    no_implicit_headers: bool = False  # skip the torch includes load_inline prepends

    def __post_init__(self):
        # Types first: a spec may also arrive as a dict from the sandboxed child (`from_dict`).
        for field_name in _TEXT_TUPLES:
            value = getattr(self, field_name)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise BuildError(f"load_inline: {field_name} must be a sequence of strings.")
        for field_name in _BOOLS:
            _bool(getattr(self, field_name), field_name)
        if self.functions is not None and not (
                isinstance(self.functions, tuple)
                and all(isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) for x in p)
                        for p in self.functions)):
            raise BuildError("load_inline: functions must be (name, docstring) pairs.")
        if self.cuda_sources and not self.with_cuda:
            raise BuildError("load_inline: cuda_sources given with with_cuda=False.")
        if not isinstance(self.name, str) or not is_identifier(self.name) or len(self.name) > 100:
            raise BuildError(f"load_inline: name {self.name!r} must be a C identifier "
                             "(letters, digits, underscore) of at most 100 characters.")
        total = sum(len(s) for s in self.cpp_sources + self.cuda_sources)
        if total > MAX_SOURCE_CHARS:
            raise BuildError(f"load_inline: sources hold {total} characters; at most "
                             f"{MAX_SOURCE_CHARS} are accepted.")
        if self.functions is not None:
            if len(self.functions) > MAX_FUNCTIONS:
                raise BuildError(f"load_inline: {len(self.functions)} functions; at most {MAX_FUNCTIONS}.")
            for fname, _doc in self.functions:
                if not _FUNCTION_NAME.match(fname):
                    raise BuildError(f"load_inline: function name {fname!r} is not a C++ name.")
        for i, text in enumerate(self.cpp_sources):
            check_source(text, f"cpp_sources[{i}]")
        for i, text in enumerate(self.cuda_sources):
            check_source(text, f"cuda_sources[{i}]")
        self.checked_flags()

    def checked_flags(self) -> dict:
        """The flags after the policy: compile flags per compiler, include dirs and link flags."""
        inc_roots, lib_roots = trusted_roots()
        cxx = flag_policy.check_cxx_flags(self.extra_cflags, include_roots=inc_roots, lib_roots=lib_roots)
        nvcc = flag_policy.check_nvcc_flags(self.extra_cuda_cflags, include_roots=inc_roots,
                                            lib_roots=lib_roots)
        ld = flag_policy.check_ldflags(self.extra_ldflags, lib_roots=lib_roots)
        includes = tuple(flag_policy.check_shell_safe(flag_policy.check_path(p, inc_roots, "extra_include_paths"),
                                                      "extra_include_paths", "include path")
                         for p in self.extra_include_paths)
        return {"cxx": cxx.compile, "nvcc": nvcc.compile, "includes": includes,
                "link": tuple(dict.fromkeys(cxx.link + (nvcc.link if self.with_cuda else ()) + ld))}

    def canonical(self) -> dict:
        """A JSON-ready dict that determines the build (keyword order plays no part)."""
        out = asdict(self)
        out["functions"] = None if self.functions is None else [list(p) for p in self.functions]
        return out

    def to_dict(self) -> dict:
        """Plain JSON-ready form (what the child sends the parent); `from_dict` reverses it."""
        return self.canonical()

    @classmethod
    def from_dict(cls, data) -> ExtensionSpec:
        """Rebuild a spec from `to_dict` output, checking it again: the dict may come from a
        sandboxed child and is treated as untrusted."""
        if not isinstance(data, dict):
            raise BuildError(f"extension spec must be a dict, got {type(data).__name__}.")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown or "name" not in data or "cpp_sources" not in data:
            raise BuildError(f"extension spec has unknown or missing fields: {unknown or ['name/cpp_sources']}.")
        values = dict(data)
        for field_name in _TEXT_TUPLES:
            if isinstance(values.get(field_name), list):
                values[field_name] = tuple(values[field_name])
        funcs = values.get("functions")
        if isinstance(funcs, list):
            values["functions"] = tuple(tuple(p) if isinstance(p, list) else p for p in funcs)
        return cls(**values)

    def summary(self) -> dict:
        """Small description for meta.json (no source text)."""
        return {"name": self.name, "with_cuda": self.with_cuda,
                "functions": None if self.functions is None else [f for f, _ in self.functions],
                "cpp_chars": sum(map(len, self.cpp_sources)),
                "cuda_chars": sum(map(len, self.cuda_sources)),
                "extra_cflags": list(self.extra_cflags), "extra_cuda_cflags": list(self.extra_cuda_cflags),
                "extra_ldflags": list(self.extra_ldflags)}

    @classmethod
    def from_load_inline_args(cls, *args, **kwargs) -> ExtensionSpec:
        """Build a spec from exactly the arguments `load_inline` accepts (positional or keyword)."""
        try:
            bound = _SIGNATURE.bind(*args, **kwargs)
        except TypeError as exc:
            raise BuildError(f"load_inline: {exc}.") from None
        bound.apply_defaults()
        a = bound.arguments
        if _sources(a["sycl_sources"], "sycl_sources", False) or a["with_sycl"]:
            raise BuildError("load_inline: SYCL sources are not supported by this evaluator.")
        cuda_sources = _sources(a["cuda_sources"], "cuda_sources", False)
        with_cuda = a["with_cuda"]
        if with_cuda is None:
            with_cuda = bool(cuda_sources)
        with_cuda = _bool(with_cuda, "with_cuda")
        if not isinstance(a["name"], str):
            raise BuildError(f"load_inline: name must be a string, got {type(a['name']).__name__}.")
        return cls(
            name=a["name"],
            cpp_sources=_sources(a["cpp_sources"], "cpp_sources", True),
            cuda_sources=cuda_sources,
            functions=_functions(a["functions"]),
            extra_cflags=_flag_list(a["extra_cflags"], "extra_cflags"),
            extra_cuda_cflags=_flag_list(a["extra_cuda_cflags"], "extra_cuda_cflags"),
            extra_ldflags=_flag_list(a["extra_ldflags"], "extra_ldflags"),
            extra_include_paths=_flag_list(a["extra_include_paths"], "extra_include_paths"),
            with_cuda=with_cuda,
            with_pytorch_error_handling=_bool(a["with_pytorch_error_handling"], "with_pytorch_error_handling"),
            is_python_module=_bool(a["is_python_module"], "is_python_module"),
            no_implicit_headers=_bool(a["no_implicit_headers"], "no_implicit_headers"),
        )
