"""The local compilers, torch installation and GPU architecture that a build depends on.

Everything here goes into the cache key (through `Toolchain.fingerprint`), so a new torch, nvcc,
host compiler, Python or GPU never reuses a library built for another.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass

# Used when no GPU is visible and nothing says otherwise: the project's target GPU (H200).
DEFAULT_ARCH = "9.0a"
# Architectures with an arch-specific ("a") variant that unlocks wgmma/TMA-style instructions.
_ARCH_SPECIFIC = {"9.0", "10.0", "10.3", "11.0", "12.0", "12.1"}
_NAMED_ARCHES = {"Ampere": "8.0;8.6", "Ada": "8.9", "Hopper": "9.0a", "Blackwell": "10.0a"}
_ARCH_ITEM = re.compile(r"(\d{1,2})\.(\d)([af]?)(\+PTX)?\Z")


@dataclass(frozen=True)
class Toolchain:
    """Where the compilers and torch live, and their versions."""

    cxx: str  # host C++ compiler (CXX or c++), absolute path
    cxx_version: str  # first line of `cxx --version`
    nvcc: str | None  # nvcc path, None when no CUDA toolkit is installed
    nvcc_version: str | None  # last line of `nvcc --version`
    cuda_home: str | None  # CUDA toolkit root
    torch_version: str  # torch.__version__
    torch_cuda: str | None  # torch.version.cuda (None for a CPU build of torch)
    torch_includes: tuple[str, ...]  # torch/include and its C++-frontend include dir
    torch_lib: str  # directory holding libtorch*.so
    python_include: str  # directory holding Python.h
    ext_suffix: str  # extension-module suffix of this Python, e.g. .cpython-311-x86_64-linux-gnu.so
    arches: tuple[str, ...]  # GPU architectures to build for, e.g. ("9.0a",)
    cxx_std: str = "c++20"  # language standard this torch's cpp_extension compiles with

    def fingerprint(self, with_cuda: bool) -> dict:
        """The parts of the toolchain that change what a build produces."""
        out = {"cxx": self.cxx_version, "torch": self.torch_version, "python": self.ext_suffix,
               "std": self.cxx_std}
        if with_cuda:
            out.update(nvcc=self.nvcc_version, torch_cuda=self.torch_cuda, arches=list(self.arches))
        return out

    @property
    def cuda_include(self) -> str | None:
        return os.path.join(self.cuda_home, "include") if self.cuda_home else None

    @property
    def cuda_lib(self) -> str | None:
        if not self.cuda_home:
            return None
        lib64 = os.path.join(self.cuda_home, "lib64")
        return lib64 if os.path.isdir(lib64) else os.path.join(self.cuda_home, "lib")

    def include_roots(self) -> tuple[str, ...]:
        """Absolute include directories a candidate may name (all read-only toolchain headers)."""
        return trusted_roots()[0]

    def lib_roots(self) -> tuple[str, ...]:
        """Absolute library directories a candidate may name with -L."""
        return trusted_roots()[1]

    def arch_flags(self) -> list[str]:
        """nvcc -gencode flags for `arches` (a "+PTX" entry also embeds PTX for forward use)."""
        flags: list[str] = []
        for arch in self.arches:
            ptx = arch.endswith("+PTX")
            num = arch.removesuffix("+PTX").replace(".", "")
            flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
            if ptx:
                flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
        return flags


@functools.lru_cache(maxsize=1)
def trusted_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(include roots, library roots) a candidate's paths may point into: torch, CUDA, Python and
    system directories. Runs no program, so the sandboxed child can check a spec too."""
    import torch

    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    cuda_home = _find_cuda_home()
    inc = [os.path.join(torch_dir, "include"), sysconfig.get_path("include", scheme="posix_prefix"),
           "/usr/include", "/usr/local/include"]
    lib = [os.path.join(torch_dir, "lib"), "/usr/lib", "/usr/lib64", "/usr/local/lib"]
    if cuda_home:
        inc.append(cuda_home)
        lib.append(cuda_home)
    return tuple(inc), tuple(lib)


def parse_arch_list(text: str) -> tuple[str, ...]:
    """Parse a TORCH_CUDA_ARCH_LIST-style string ("8.0;9.0a", "9.0+PTX", "Hopper")."""
    for name, value in _NAMED_ARCHES.items():
        text = text.replace(name, value)
    items = [t for t in re.split(r"[;\s,]+", text.strip()) if t]
    for item in items:
        if not _ARCH_ITEM.match(item):
            raise ValueError(f"unknown CUDA architecture {item!r} (expected e.g. 8.0, 9.0a, 9.0+PTX)")
    return tuple(dict.fromkeys(items))


def _run_first_line(cmd: Sequence[str], last: bool = False) -> str:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60,
                             env={**os.environ, "LC_ALL": "C"}).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not out:
        return "unknown"
    return out[-1] if last else out[0]


def _find_cuda_home() -> str | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var) and os.path.isdir(os.environ[var]):
            return os.environ[var]
    if os.path.exists("/usr/local/cuda/bin/nvcc"):
        return "/usr/local/cuda"
    nvcc = shutil.which("nvcc")
    if nvcc:
        return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    return None


def _nvcc_arch_list(nvcc: str) -> set[str]:
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {m.group(1) for m in re.finditer(r"compute_(\d+)", out)}


def _capability_to_arch(major: int, minor: int, nvcc_arches: set[str]) -> str:
    """The best arch string for a device: arch-specific when nvcc knows the base arch."""
    num = f"{major}{minor}"
    if nvcc_arches and num not in nvcc_arches:
        lower = sorted((int(a) for a in nvcc_arches if int(a) <= int(num)), reverse=True)
        if not lower:
            return DEFAULT_ARCH
        num = str(lower[0])
        return f"{num[:-1]}.{num[-1]}+PTX"
    version = f"{major}.{minor}"
    return version + "a" if version in _ARCH_SPECIFIC else version


def _local_capabilities() -> list[tuple[int, int]]:
    """Compute capabilities of visible GPUs, asking nvidia-smi first so that this (trusted,
    possibly forking) process does not have to initialise CUDA itself."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=60)
            caps = [tuple(int(x) for x in line.strip().split(".")) for line in out.stdout.splitlines()
                    if re.fullmatch(r"\d+\.\d+", line.strip())]
            if out.returncode == 0 and caps:
                return caps  # type: ignore[return-value]
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    try:
        import torch

        if torch.cuda.is_available():
            return [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    except Exception:  # a broken driver means "no GPU" here, the build itself still works
        pass
    return []


def resolve_arches(arch: str | Sequence[str] | None, nvcc: str | None) -> tuple[str, ...]:
    """Explicit argument, then TORCH_CUDA_ARCH_LIST, then the local GPUs, then DEFAULT_ARCH."""
    if arch:
        return parse_arch_list(arch if isinstance(arch, str) else ";".join(arch))
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if env and env != "native":
        return parse_arch_list(env)
    caps = _local_capabilities()
    if not caps:
        return (DEFAULT_ARCH,)
    nvcc_arches = _nvcc_arch_list(nvcc) if nvcc else set()
    return tuple(sorted({_capability_to_arch(ma, mi, nvcc_arches) for ma, mi in caps}))


def torch_cxx_std(torch_dir: str) -> str:
    """The -std= that this torch's own load_inline uses (read from its source, not run), so a
    candidate compiles under the same language rules as with stock torch."""
    try:
        with open(os.path.join(torch_dir, "utils", "cpp_extension.py"), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return "c++20"
    found = re.findall(r"-std=(c\+\+\d\d)", text)
    return max(set(found), key=found.count) if found else "c++20"


@functools.lru_cache(maxsize=8)
def _detect(arch_key: str | None, env_arch: str | None) -> Toolchain:
    import torch

    cxx = shutil.which(os.environ.get("CXX", "c++")) or "c++"
    cuda_home = _find_cuda_home()
    nvcc = None
    if cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        nvcc = os.path.join(cuda_home, "bin", "nvcc")
    elif shutil.which("nvcc"):
        nvcc = shutil.which("nvcc")
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    include = os.path.join(torch_dir, "include")
    return Toolchain(
        cxx=cxx,
        cxx_version=_run_first_line([cxx, "--version"]),
        nvcc=nvcc,
        nvcc_version=_run_first_line([nvcc, "--version"], last=True) if nvcc else None,
        cuda_home=cuda_home,
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda,
        torch_includes=(include, os.path.join(include, "torch", "csrc", "api", "include")),
        torch_lib=os.path.join(torch_dir, "lib"),
        python_include=sysconfig.get_path("include", scheme="posix_prefix"),
        ext_suffix=sysconfig.get_config_var("EXT_SUFFIX") or f".cpython-{sys.version_info.major}"
                                                             f"{sys.version_info.minor}.so",
        arches=resolve_arches(arch_key, nvcc),  # reads TORCH_CUDA_ARCH_LIST (env_arch) itself
        cxx_std=torch_cxx_std(torch_dir),
    )


def detect_toolchain(arch: str | Sequence[str] | None = None) -> Toolchain:
    """Detect (once per process and arch choice) the toolchain builds will use."""
    key = arch if isinstance(arch, str) or arch is None else ";".join(arch)
    return _detect(key, os.environ.get("TORCH_CUDA_ARCH_LIST"))
