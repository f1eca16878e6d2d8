"""`BuildConfig`: how builds run on this machine (not what they build; that is `ExtensionSpec`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cuda_l1.settings import setting

PCH_MODES = ("auto", "wait", "off")


def default_cache_dir() -> Path:
    """$CUDA_L1_CACHE, else ~/.cache/cuda-l1/builds."""
    env = os.environ.get("CUDA_L1_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "cuda-l1" / "builds"


@dataclass(frozen=True)
class BuildConfig:
    """Knobs of the build layer; the defaults are what the evaluator uses."""

    cache_dir: str | os.PathLike | None = setting(None, "where builds live; None: default_cache_dir()")
    arch: str | None = setting(None, 'GPU archs ("9.0a", "8.0;9.0+PTX"); None: TORCH_CUDA_ARCH_LIST, local GPU, 9.0a')
    pch: str = setting("auto", 'precompiled headers (torch/extension.h for the binding TU, the implicit headers '
                       'in nvcc\'s host compile): "auto" (use if built, else build in the background and compile '
                       'without), "wait" (build first), "off"')
    slim_cuda_headers: bool = setting(True, "give .cu files <torch/types.h> for <torch/extension.h> when safe")
    split_nvcc: bool = setting(True, "run nvcc's host and device front ends side by side (nvcc_split.py)")
    timeout_s: float = setting(900.0, "limit per compiler or linker command")
    cache_failures: bool = setting(True, "keep compile errors so the same source is never compiled twice")
    max_entry_bytes: int = setting(256 * 2**20, "largest build the cache keeps (its files in all); a larger one "
                                   "fails, and its error is kept in place of its files (cache_limits.py)")
    cache_max_bytes: int = setting(20 * 2**30, "the cache's builds past this size lose the ones used longest "
                                   "ago, down to 90% of it (precompiled headers not counted; 0: no limit)")

    def __post_init__(self):
        if self.pch not in PCH_MODES:
            raise ValueError(f"BuildConfig.pch must be one of {PCH_MODES}, got {self.pch!r}")

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()
