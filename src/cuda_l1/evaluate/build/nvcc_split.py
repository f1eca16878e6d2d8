"""Run nvcc's own pipeline with its two front ends in parallel.

For one `.cu` nvcc runs, one after another: host preprocessing and `cudafe++` (host front end),
device preprocessing, `cicc`, `ptxas` and `fatbinary` (device side), then the host compiler on
cudafe++'s output, which includes the fatbinary. The two front ends are independent except that
cudafe++ writes a "module id" file that cicc reads; writing that file ourselves lets both chains
run at once. Everything else is exactly what `nvcc --dryrun` prints, run with the environment it
prints, so flags, defines and outputs are nvcc's own; any dry-run shape we do not recognise means
"run plain nvcc" instead. The one addition: the final host compile may load the implicit headers'
part of cudafe++'s output precompiled (`host_pch.HostPrefix`), with the same object as a result,
and falls back to nvcc's own line whenever that does not apply.

Measured for the benchmark's one-kernel `.cu` with <torch/types.h> (nvcc 13.0, gcc 12, idle
2-core VM, CPU s): host preprocess + cudafe++ 11.0, device preprocess + cicc + ptxas 7.7, host
compile 5.9; plain nvcc 24.1 s wall, split 18.1 s wall (the gain needs a free second core; on a
loaded machine it is nil). The object has the same symbols as plain nvcc's, apart from the module
id inside anonymous-namespace names.

The module id is one constant (`MODULE_ID`) rather than nvcc's per-file hash: cudafe++ writes it into
the first ~13 MB of `cudafe1.cpp` (cccl's anonymous namespace), and with one id that text is the same
for every candidate built with the same flags, so the host compile can load it precompiled
(`host_pch.py`). Two extensions with one id never meet: the id only names hidden or local symbols
(no `_GLOBAL__N_` symbol is exported from a linked library), each library registers its own
fatbinary and so gets its own CUmodule, and relocatable-device-code builds (nvlink, where ids must
differ) never take this path. A GPU test loads two such extensions side by side.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple, Protocol

from cuda_l1.evaluate.build.procs import CommandResult, run_command

KEEP_DIR = "nvcc"  # intermediates, inside the build directory
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z")
# In nvcc's shape, `_<hex8>_<length>_<file>_<hex8>`; the same for every build (see the docstring).
MODULE_ID = "_00000000_7_cuda_cu_00000000"


@dataclass
class SplitPlan:
    """The dry-run commands grouped into the two parallel chains and the final host compile."""

    env: dict  # environment for the commands (ours plus what nvcc sets)
    host_front: list[str]  # host preprocessing, cudafe++
    device: list[str]  # device preprocessing, cicc, ptxas, fatbinary
    host_compile: list[str]  # host compiler on cudafe++ output
    module_id_file: Path  # written before the chains start


def _prog(line: str) -> str:
    first = line.split(None, 1)[0].strip('"')
    return os.path.basename(first)


def plan_split(nvcc_cmd: Sequence[str], workdir: Path, env: dict) -> SplitPlan | None:
    """Ask nvcc for its commands; None when they are not the shape this module knows."""
    keep = workdir / KEEP_DIR
    keep.mkdir(exist_ok=True)
    try:
        dry = subprocess.run([*nvcc_cmd, "--dryrun", "-keep", "-keep-dir", KEEP_DIR], cwd=workdir, env=env,
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    if dry.returncode != 0:
        return None
    run_env = dict(env)
    host_front: list[str] = []
    device: list[str] = []
    host_compile: list[str] = []
    module_id_file = None
    for raw in (dry.stdout + dry.stderr).splitlines():
        if not raw.startswith("#$ "):
            continue
        line = raw[3:].strip()
        assign = _ASSIGN.match(line)
        if assign and " " not in assign.group(1):
            value = assign.group(2).strip()
            if len(value) >= 2 and value[0] == value[-1] == '"' and value.count('"') == 2:
                value = value[1:-1]
            run_env[assign.group(1)] = value
            continue
        prog = _prog(line)
        if prog == "cudafe++":
            m = re.search(r'--gen_module_id_file --module_id_file_name "([^"]+)"', line)
            if m is None or module_id_file is not None:
                return None
            module_id_file = workdir / m.group(1)
            host_front.append(line.replace("--gen_module_id_file ", ""))
        elif prog in ("gcc", "g++", "c++", "cc") and " -E " in line:
            (device if "-D__CUDA_ARCH__=" in line else host_front).append(line)
        elif prog in ("gcc", "g++", "c++", "cc") and " -c " in line:
            host_compile.append(line)
        elif prog in ("cicc", "ptxas", "fatbinary", "rm") or line.startswith('"$CICC_PATH/cicc"'):
            device.append(line)
        else:
            return None  # nvlink, a different host compiler, ...: not a pipeline we know
    if module_id_file is None or len(host_compile) != 1 or not device or len(host_front) != 2:
        return None
    return SplitPlan(run_env, host_front, device, host_compile, module_id_file)


def _chain(name: str, lines: list[str], cwd: Path, env: dict, deadline: float, label: str) -> CommandResult:
    outputs, cpu, start = [], 0.0, time.perf_counter()
    last = None
    for line in lines:
        last = run_command(name, ["/bin/sh", "-c", line], cwd=cwd, env=env,
                           timeout_s=max(1.0, deadline - time.monotonic()), label=label)
        outputs.append(last.output)
        cpu += last.cpu_s
        if not last.ok:
            break
    return CommandResult(name, lines, last.returncode if last else 0, time.perf_counter() - start, cpu,
                         "".join(outputs), bool(last and last.timed_out), bool(last and last.cancelled))


class HostPrefix(Protocol):
    """A precompiled start of cudafe++'s output (`host_pch.HostPrefix`)."""

    def compile(self, line: str, cwd: Path,
                run: Callable[[str], CommandResult]) -> tuple[str, CommandResult | None]: ...


class SplitRun(NamedTuple):
    """What `run_split` did."""

    result: CommandResult  # one result that reads like plain nvcc's
    timings: dict  # per chain: wall_s, cpu_s
    host_pch: str | None  # the precompiled prefix's outcome (HostPrefix.compile); None: none offered


def write_module_id(plan: SplitPlan) -> None:
    """The file cudafe++ and cicc read the module id from (nvcc would have cudafe++ write it)."""
    plan.module_id_file.parent.mkdir(parents=True, exist_ok=True)
    plan.module_id_file.write_text(MODULE_ID)


def run_split(plan: SplitPlan, nvcc_cmd: Sequence[str], *, cwd: Path, timeout_s: float, label: str,
              host_prefix: HostPrefix | None = None) -> SplitRun:
    """Run the plan; the host compile loads `host_prefix`'s precompiled header when it can."""
    write_module_id(plan)
    deadline = time.monotonic() + timeout_s
    start = time.perf_counter()
    chains: dict[str, CommandResult] = {}

    def _go(name, lines):
        chains[name] = _chain(name, lines, cwd, plan.env, deadline, label)

    threads = [threading.Thread(target=_go, args=("host_front", plan.host_front), daemon=True),
               threading.Thread(target=_go, args=("device", plan.device), daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    order = [chains["host_front"], chains["device"]]
    # nvcc stops at the first failing stage; report what it would have printed.
    shown = order[:1] if not order[0].ok else order
    host_pch = None
    if all(c.ok for c in order):
        chains["host_compile"], host_pch = _host_compile(plan, cwd, deadline, label, host_prefix)
        shown = order + [chains["host_compile"]]
    failed = next((c for c in shown if not c.ok), None)
    result = CommandResult("cuda", list(nvcc_cmd), failed.returncode if failed else 0,
                           time.perf_counter() - start, sum(c.cpu_s for c in chains.values()),
                           "".join(c.output for c in shown), any(c.timed_out for c in chains.values()),
                           any(c.cancelled for c in chains.values()))
    timings = {f"cuda_{n}": {"wall_s": round(c.wall_s, 3), "cpu_s": round(c.cpu_s, 3)} for n, c in chains.items()}
    return SplitRun(result, timings, host_pch)


def run_host_compile(plan: SplitPlan, *, cwd: Path, timeout_s: float, label: str,
                     host_prefix: HostPrefix | None = None) -> tuple[CommandResult, str | None]:
    """The host compile alone, on what the two chains left in `cwd` (to time it, or to redo it):
    its result and the precompiled prefix's outcome (None: none offered)."""
    return _host_compile(plan, cwd, time.monotonic() + timeout_s, label, host_prefix)


def _host_compile(plan: SplitPlan, cwd: Path, deadline: float, label: str,
                  host_prefix: HostPrefix | None) -> tuple[CommandResult, str | None]:
    """The host compile on the precompiled prefix when it applies, else (or after any failure on
    it) on cudafe++'s text exactly as nvcc runs it; the time of a failed try counts too."""
    def run(lines: list[str]) -> CommandResult:
        return _chain("host_compile", lines, cwd, plan.env, deadline, label)

    if host_prefix is None:
        return run(plan.host_compile), None
    outcome, tried = host_prefix.compile(plan.host_compile[0], cwd, lambda line: run([line]))
    if outcome == "used":
        return tried, outcome
    plain = run(plan.host_compile)
    if tried is not None:
        plain = replace(plain, wall_s=plain.wall_s + tried.wall_s, cpu_s=plain.cpu_s + tried.cpu_s)
    return plain, outcome
