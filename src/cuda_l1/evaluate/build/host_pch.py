"""A precompiled header of the part of nvcc's host-compiler input that every candidate shares.

cudafe++ writes `cuda.cudafe1.cpp` as one preprocessed file: the implicit headers (torch/types.h,
cuda.h, cuda_runtime.h: ~13 MB, ~409 k lines) first, then the candidate's own code, then an epilogue
that includes the stub and the fatbinary. With one nvcc module id for every build
(`nvcc_split.MODULE_ID`) that first part is byte-identical for every candidate with the same
toolchain and flags. The store keeps it as `prefix.h` beside its `.gch`, built once per key from a
probe: nvcc's host front end on an empty `cuda.cu`, cut where the epilogue starts, compiled by the
dry run's own host-compile line (as a header). A build whose `cudafe1.cpp` starts with `prefix.h`
byte for byte then compiles only the rest, under the same file name (static-initialiser symbols are
named after it), with `-include prefix.h`; gcc loads a valid PCH exactly as if it read the text, so
the object is byte-identical. Anything else (another prefix, a PCH gcc does not load, a failed
compile) compiles the original text as nvcc would, so errors read as they always did.

Measured (2-core EPYC, gcc 12, nvcc 13.0, torch 2.13, the benchmark's one-kernel `.cu`, medians of
3): host compile 7.1-8.1 s -> 2.5-3.2 s, the whole `.cu` 26-29 s -> 20-23 s; probe and PCH build
~36 s once per key, 423 MB. With `-g` only the debug info differs (it records `-H`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cuda_l1.evaluate.build.nvcc_split import MODULE_ID, SplitPlan, plan_split, write_module_id
from cuda_l1.evaluate.build.pch import PchStore, pch_used, start_in_background, strip_include_trace
from cuda_l1.evaluate.build.procs import HEADER_FILE_BYTES, CommandResult, compiler_env, run_command
from cuda_l1.evaluate.build.toolchain import Toolchain

PREFIX_HEADER = "prefix.h"
# The end of the host-compile line: cudafe++'s output and the object (file names, not flags).
_HOST_FILES = re.compile(r'(?P<input>"[^"]*\.cudafe1\.cpp") -o (?P<output>"[^"]*")\s*\Z')
_MODULE_DEFINE = re.compile(r'(TORCH_EXTENSION_NAME=)[^"\s]*')  # differs per module, read by no header
_STUB_NAME = re.compile(r'--stub_file_name "([^"]+)"')


def _failure(why: str) -> CommandResult:
    return CommandResult("probe", [], 1, 0.0, 0.0, why, False)


@dataclass(frozen=True)
class HostPrefix:
    """A ready prefix: `header` (prefix.h) beside its .gch."""

    header: Path

    def compile(self, line: str, cwd: Path,
                run: Callable[[str], CommandResult]) -> tuple[str, CommandResult | None]:
        """Run the host-compile `line` on the precompiled prefix. Returns the outcome and what ran:
        "used" (the result stands), or "mismatch" (the text does not start with the prefix; nothing
        ran), "rejected" (gcc did not load the .gch) or "failed" (it did, and the compile failed),
        after which the caller compiles the original text, which is back in place. gcc rejects a
        PCH for every build of its key alike, and a rejected try costs a whole compile: such a
        prefix is marked failed, never offered again."""
        files = _HOST_FILES.search(line)
        if files is None:
            return "mismatch", None
        source = cwd / shlex.split(files["input"])[0]
        try:
            prefix, text = self.header.read_bytes(), source.read_bytes()
        except OSError:
            return "mismatch", None
        if not text.startswith(prefix):
            return "mismatch", None
        on_prefix = (f"{line[:files.start()]}-include {shlex.quote(str(self.header))} -Winvalid-pch -H "
                     f"{line[files.start():]}")
        try:
            source.write_bytes(text[len(prefix):])  # same name: symbols derived from it stay the same
            tried = run(on_prefix)
        finally:
            source.write_bytes(text)
        if not pch_used(tried.output):
            if not (tried.timed_out or tried.cancelled):  # stopped early, it may not have reached the .gch
                (self.header.parent / "failed").write_text(strip_include_trace(tried.output)[-4000:])
            return "rejected", tried
        if not tried.ok:
            return "failed", tried
        return "used", replace(tried, output=strip_include_trace(tried.output))


class HostPchStore:
    """Precompiled prefixes under `<cache>/pch/host-<key>/`, next to the torch/extension.h ones (same
    lock, "failed" marker and background builds: `PchStore`)."""

    def __init__(self, root: Path):
        self.store = PchStore(root, PREFIX_HEADER)

    def key(self, toolchain: Toolchain, plan: SplitPlan, workdir: Path) -> str:
        """sha256 over what makes the prefix and its PCH: compiler versions, the host front end and
        host-compile commands with the build's directory, module name and file names left out, and
        the module id."""
        def neutral(line: str) -> str:
            for path in {str(workdir), os.path.realpath(workdir)}:
                line = line.replace(f'"{path}/', '"')
            return _MODULE_DEFINE.sub(r"\1", line)

        material = {"nvcc": toolchain.nvcc_version, "cxx": toolchain.cxx_version, "torch": toolchain.torch_version,
                    "host_front": [neutral(line) for line in plan.host_front],
                    "host_compile": [_HOST_FILES.sub("", line) for line in plan.host_compile],
                    "module_id": MODULE_ID}
        return "host-" + hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]

    def prefix(self, key: str) -> HostPrefix | None:
        header = self.store.ready(key)
        return HostPrefix(header) if header is not None and not self.failed(key) else None

    def failed(self, key: str) -> bool:
        return self.store.failed(key)

    def for_build(self, key: str, toolchain: Toolchain, nvcc_cmd: Sequence[str], mode: str,
                  timeout_s: float) -> tuple[HostPrefix | None, str]:
        """The prefix a build may use now, or None and why ("off", "building", "none"). `mode` is
        `BuildConfig.pch`: "wait" builds it first, "auto" starts building it in the background; or
        "use": one that exists, none started (compile.headers_worth_building)."""
        if mode == "off":
            return None, "off"
        prefix = self.prefix(key)
        if prefix is None and mode == "wait":
            prefix = self.build(key, toolchain, nvcc_cmd, timeout_s)
        elif prefix is None and mode == "auto" and not self.failed(key):
            if self.build_in_background(key, toolchain, nvcc_cmd, timeout_s):
                return None, "building"
        return prefix, "ready" if prefix is not None else "none"

    def build(self, key: str, toolchain: Toolchain, nvcc_cmd: Sequence[str], timeout_s: float,
              blocking: bool = True) -> HostPrefix | None:
        """Probe and precompile the prefix of `nvcc_cmd`'s builds unless done (see `PchStore.build`)."""
        def make(kdir: Path, header: Path, tmp: Path, nice: list[str]) -> list[CommandResult]:
            probe = kdir / "probe"
            shutil.rmtree(probe, ignore_errors=True)
            probe.mkdir()
            try:
                return self._probe_and_compile(key, toolchain, nvcc_cmd, probe, header, tmp, nice, timeout_s)
            finally:
                shutil.rmtree(probe, ignore_errors=True)  # nvcc's intermediates: tens of MB

        header = self.store.build_once(key, make, blocking)
        return HostPrefix(header) if header is not None else None

    def build_in_background(self, key: str, toolchain: Toolchain, nvcc_cmd: Sequence[str],
                            timeout_s: float) -> bool:
        return start_in_background(self.store.root, f"pch-{key[:13]}",
                                   lambda: self.build(key, toolchain, nvcc_cmd, timeout_s, blocking=False))

    def _probe_and_compile(self, key: str, toolchain: Toolchain, nvcc_cmd: Sequence[str], probe: Path,
                           header: Path, tmp: Path, nice: list[str], timeout_s: float) -> list[CommandResult]:
        (probe / "cuda.cu").write_text("")  # the implicit headers come from -include flags
        plan = plan_split(nvcc_cmd, probe, compiler_env(probe))
        if plan is None or self.key(toolchain, plan, probe) != key:
            return [_failure("nvcc's commands for an empty cuda.cu are not those of the build")]
        write_module_id(plan)
        results = []
        for line in plan.host_front:  # confined like every compiler, and never on candidate code
            results.append(run_command("probe", [*nice, "/bin/sh", "-c", line], cwd=probe, env=plan.env,
                                       timeout_s=timeout_s, label=f"pch:{key}", file_bytes=HEADER_FILE_BYTES))
            if not results[-1].ok:
                return results
        line = plan.host_compile[0]
        files, stub = _HOST_FILES.search(line), _STUB_NAME.search(" ".join(plan.host_front))
        if files is None or stub is None or " -c -x c++ " not in line:
            return results + [_failure(f"unknown host-compile line: {line}")]
        text = (probe / shlex.split(files["input"])[0]).read_bytes()
        cut = text.rfind(f'\n# 1 "{stub[1]}"\n#define _NV_ANON_NAMESPACE'.encode())
        if cut < 0:
            return results + [_failure("cudafe++'s output has no stub epilogue")]
        header.write_bytes(text[:cut])
        as_header = (line[:files.start()].replace(" -c -x c++ ", " -x c++-header ", 1)
                     + f"{shlex.quote(str(header))} -o {shlex.quote(str(tmp))}")
        return results + [run_command("pch", [*nice, "/bin/sh", "-c", as_header], cwd=header.parent,
                                      env=plan.env, timeout_s=timeout_s, label=f"pch:{key}",
                                      file_bytes=HEADER_FILE_BYTES)]
