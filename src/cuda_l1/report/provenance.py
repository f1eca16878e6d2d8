"""What ran, where and when: the facts every summary.json and report.html carry beside their numbers."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path


def command_line(argv: list[str] | None = None) -> str:
    """The command as a user would type it again: `cuda-l1 bench builtin --out runs/x`."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return ""
    program = Path(argv[0]).name
    if program == "__main__.py":  # python -m cuda_l1
        program = "python -m cuda_l1"
    return " ".join([program] + [shlex.quote(a) for a in argv[1:]])


def git_commit(root: Path | None = None) -> dict | None:
    """The commit of the cuda-l1 checkout this code runs from (None for an installed wheel, or without
    git); `dirty` says whether tracked files differ from it."""
    root = root or Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions() -> dict:
    from cuda_l1 import __version__

    versions = {"cuda_l1": __version__, "python": platform.python_version()}
    try:
        import torch

        versions["torch"] = torch.__version__
        versions["cuda"] = torch.version.cuda
    except ImportError:  # reports can be rebuilt without torch
        pass
    return versions


def _hardware() -> dict:
    info = {"os": platform.platform(), "cpu": _cpu_name(), "cpu_count": os.cpu_count()}
    if hasattr(os, "sched_getaffinity"):
        info["cpus_allowed"] = len(os.sched_getaffinity(0))
    try:
        import torch

        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return info


def provenance(argv: list[str] | None = None) -> dict:
    """Date, command line, versions, git commit and hardware of this process."""
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": command_line(argv),
        "versions": _versions(),
        "git": git_commit(),
        "hardware": _hardware(),
    }
