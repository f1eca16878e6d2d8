"""The environment a side starts with: built from an allow-list, credentials never included."""

from __future__ import annotations

import os
import re

# Variables a child may inherit; everything else is dropped. Even these are dropped if their name
# looks like a credential.
_ENV_ALLOW = re.compile(
    r"^(PATH|LANG|LANGUAGE|LC_[A-Z]+|TZ|TERM|PYTHONPATH|PYTHONHASHSEED|LD_LIBRARY_PATH|CUDA_HOME|CUDA_PATH|"
    r"CUDA_VISIBLE_DEVICES|CUDA_DEVICE_ORDER|CUDA_MODULE_LOADING|NVIDIA_[A-Z_]+|TORCH_CUDA_ARCH_LIST|"
    r"OMP_NUM_THREADS|MKL_NUM_THREADS|NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)$"
)
SECRET_NAME = re.compile(
    r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|CERT|^AWS_|^HF_|^HUGGING|^OPENAI|"
    r"^ANTHROPIC|^AZURE|^GOOGLE|^GCP|^GITHUB|^GH_|^WANDB|^DEEPSEEK|^MISTRAL|^COHERE|^TOGETHER|^GROQ)",
    re.IGNORECASE,
)


def scrubbed_env(scratch: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if _ENV_ALLOW.match(k) and not SECRET_NAME.search(k)}
    env.update(
        HOME=scratch,
        TMPDIR=scratch,
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        PYTHONNOUSERSITE="1",
        TRITON_CACHE_DIR=os.path.join(scratch, "triton"),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(scratch, "inductor"),
        TORCH_EXTENSIONS_DIR=os.path.join(scratch, "torch_extensions"),
        # Inductor's compile workers would outlive a call; compile in-process instead.
        TORCHINDUCTOR_COMPILE_THREADS="1",
        XDG_CACHE_HOME=os.path.join(scratch, "cache"),
    )
    if env.get("PYTHONPATH"):
        # A side starts in its scratch directory: a relative entry (PYTHONPATH=src, run from a
        # checkout) would name nothing there, and an empty one would name the scratch itself.
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    if "PATH" not in env:
        env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    return env
