"""The build recipe: two translation units compiled in parallel, then one link.

What stock `load_inline` does (ninja over main.cpp and cuda.cu, then link against torch) with the
same flags and defines, plus what makes it fast:
- the binding TU (`main.cpp`, c++) and the CUDA TU (`cuda.cu`, nvcc) run as two processes at once;
- the binding TU loads a precompiled <torch/extension.h> (see `pch.py`);
- the CUDA TU gets <torch/types.h> instead of <torch/extension.h> when that is safe (`translation_units.py`);
- nvcc targets only the local GPU, arch-specific (`-gencode arch=compute_90a,code=sm_90a` on H200);
- nvcc's steps run as two parallel chains (`nvcc_split.py`), and its final host compile loads the
  implicit headers' part of cudafe++'s output precompiled (`host_pch.py`);
- both precompiled headers for the default flags start building when a `BuildPool` or the evaluator's
  `Prebuilder` starts (`start_pch_builds`), so the first candidate finds them ready.

Measured on a 2-core EPYC VM (shared, so CPU seconds are the steady figure), gcc 12.2, nvcc 13.0,
torch 2.13 CPU, `benchmarks/compile_time.py` candidate (one elementwise kernel + one binding):
  C++-only variant, end to end (median of 3, wall): stock load_inline 13.9 s; here with the PCH
    built 6.6 s (binding TU 5.5-7.5 s CPU, link 0.3 s); cached < 1 ms; first build of a flag set
    21.4 s (no PCH yet, and on 2 cores the background PCH build, 37 s CPU, competes with it).
  CUDA TU (.cu -> .o) with <torch/extension.h> as written, plain nvcc: 53-55 s CPU;
    slim (<torch/types.h>): 22-24 s CPU; slim + split nvcc: 18.1 s wall on an idle pair of cores
    (host front end 11.0 s, device chain 7.7 s, then host compile 5.9 s).
  So a cold CUDA build here is bounded by the .cu TU: ~18 s vs ~55 s; the binding TU runs beside it.
  With the host prefix precompiled (host_pch.py) the .cu's host compile takes 2.5-3.2 s instead of
    7.1-8.1 s and the whole .cu 19.9-23.3 s instead of 26.1-29.1 s (medians of 3, a busier VM than
    above); its one-time build per flag set takes ~36 s (423 MB).
The module name is `<name>_<key prefix>` so two candidates' modules never collide in one process.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cuda_l1.evaluate.build.build_config import BuildConfig
from cuda_l1.evaluate.build.flags import names_gpu_arch
from cuda_l1.evaluate.build.host_pch import HostPchStore
from cuda_l1.evaluate.build.pch import PchStore, pch_used, start_in_background, strip_include_trace
from cuda_l1.evaluate.build.nvcc_split import plan_split, run_split
from cuda_l1.evaluate.build.procs import CommandResult, allow_reads, compiler_env, in_parallel, run_command
from cuda_l1.evaluate.build.translation_units import (IMPLICIT_CPP_HEADER, IMPLICIT_CUDA_HEADERS, MISSING_NAME,
                                            cpp_translation_unit, cuda_translation_unit, declared_module_name)
from cuda_l1.evaluate.build.spec import ExtensionSpec
from cuda_l1.evaluate.build.toolchain import Toolchain, detect_toolchain

# Bump whenever the recipe changes what a build produces. 3: compilers confined; 4: one nvcc module id
# for every build (it is in the object's anonymous-namespace symbol names), so that the host compile
# can share one precompiled prefix.
RECIPE_VERSION = "4"
# The defines and options stock load_inline gives every nvcc compile.
COMMON_NVCC_FLAGS = ("-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                     "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                     "--expt-relaxed-constexpr")
MAX_ERROR_CHARS = 6000
# Candidate flags for which a missing precompiled header is built in the background: optimisation,
# debug-info, warning and language-standard flags that many candidates share. Any other flag (a -D
# above all, unique per candidate if it likes) still uses a header that exists but starts none: each
# is a compile of the whole of torch's headers, and hundreds of megabytes (an adversarial reading
# started one per candidate).
_COMMON_FLAG = re.compile(r"-O[0-3s]|-g|-lineinfo|--?use_fast_math|-ffast-math|-funroll-loops|-w|-Wall|-Wextra"
                          r"|-fPIC|--?std=c\+\+(14|17|20)|--expt-(relaxed-constexpr|extended-lambda)"
                          r"|(-Xptxas|--ptxas-options)[= ].*|-Xptxas")


def headers_worth_building(spec: ExtensionSpec) -> bool:
    """Whether a build of `spec` may start building the precompiled headers it lacks."""
    checked = spec.checked_flags()
    flags = (*checked["cxx"], *checked["nvcc"])
    # No flag twice: ["-O2"] * k would key k header sets of one flag (an adversarial reading did).
    return (not checked["includes"] and all(_COMMON_FLAG.fullmatch(f) for f in flags)
            and all(len(set(fs)) == len(fs) for fs in (checked["cxx"], checked["nvcc"])))


def build_key(spec: ExtensionSpec, toolchain: Toolchain, config: BuildConfig) -> str:
    """sha256 over the spec, the toolchain (versions, GPU archs) and the recipe."""
    material = {"recipe": RECIPE_VERSION, "spec": spec.canonical(),
                "toolchain": toolchain.fingerprint(spec.with_cuda),
                "slim_cuda_headers": bool(config.slim_cuda_headers and spec.cuda_sources)}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def module_name_for(spec: ExtensionSpec, key: str) -> str:
    """The Python module name: the one hard-coded in PYBIND11_MODULE(...) if any, else unique."""
    return declared_module_name(spec.cpp_sources + spec.cuda_sources) or f"{spec.name}_{key[:16]}"


@dataclass
class CompileOutcome:
    """What a build produced."""

    ok: bool  # the library was linked
    module_name: str  # name to import it under
    library: str | None  # file name of the .so inside the build directory
    error: str  # trimmed compiler/linker messages when not ok
    log: str  # full commands and outputs
    transient: bool = False  # timed out, killed or out of memory: says more about the machine, not cached
    timings: dict = field(default_factory=dict)  # step -> {"wall_s", "cpu_s"}, plus "total_s"
    notes: dict = field(default_factory=dict)  # pch, host_pch: used/rejected/building/off/none...; cuda_headers


def _include_flags(spec_includes, toolchain: Toolchain, with_cuda: bool) -> list[str]:
    flags = [f"-I{p}" for p in spec_includes]
    system = list(toolchain.torch_includes)
    if with_cuda and toolchain.cuda_include and toolchain.cuda_include != "/usr/include":
        system.append(toolchain.cuda_include)
    system.append(toolchain.python_include)
    for inc in system:
        flags += ["-isystem", inc]
    return flags


def cxx_flags(spec: ExtensionSpec, toolchain: Toolchain, checked: dict) -> list[str]:
    """Flags of the binding TU, except the module-name define (shared with its PCH)."""
    return (["-DTORCH_API_INCLUDE_EXTENSION_H"]
            + _include_flags(checked["includes"], toolchain, spec.with_cuda)
            + ["-fPIC", f"-std={toolchain.cxx_std}", *checked["cxx"]])


def nvcc_command(spec: ExtensionSpec, toolchain: Toolchain, checked: dict, module: str) -> list[str]:
    user = list(checked["nvcc"])
    cmd = [toolchain.nvcc or "nvcc", f"-DTORCH_EXTENSION_NAME={module}", "-DTORCH_API_INCLUDE_EXTENSION_H",
           *_include_flags(checked["includes"], toolchain, True), *COMMON_NVCC_FLAGS]
    if not names_gpu_arch(user):
        cmd += toolchain.arch_flags()
    if not spec.no_implicit_headers:
        for header in IMPLICIT_CUDA_HEADERS:
            cmd += ["-include", header]
    cmd += ["--compiler-options", "-fPIC", *user]
    if not any(f.startswith(("-std=", "--std=")) for f in user):
        cmd.append(f"-std={toolchain.cxx_std}")
    return cmd + ["-c", "cuda.cu", "-o", "cuda.cuda.o"]


def link_command(spec: ExtensionSpec, toolchain: Toolchain, checked: dict, objects, library: str) -> list[str]:
    cmd = [toolchain.cxx, *objects, "-shared", *checked["link"], f"-L{toolchain.torch_lib}", "-lc10"]
    if spec.with_cuda:
        cmd.append("-lc10_cuda")
    cmd.append("-ltorch_cpu")
    if spec.with_cuda:
        cmd.append("-ltorch_cuda")
    cmd += ["-ltorch", "-ltorch_python"]
    if spec.with_cuda and toolchain.cuda_lib:
        cmd += [f"-L{toolchain.cuda_lib}", "-lcudart"]
    return cmd + ["-o", library]


def trim_output(text: str, workdir: Path, toolchain: Toolchain) -> str:
    """The useful part of compiler output: error lines with a little context, paths shortened."""
    replacements = [(str(workdir) + "/", ""), (str(workdir), "."),
                    (toolchain.torch_includes[0], "<torch>/include"), (toolchain.python_include, "<python>")]
    if toolchain.cuda_home:
        replacements.append((toolchain.cuda_home, "<cuda>"))
    for old, new in replacements:
        text = text.replace(old, new)
    lines = strip_include_trace(text).splitlines()
    marks = [i for i, line in enumerate(lines)
             if re.search(r"\berror\b|undefined reference|undefined symbol|ld returned|Killed", line, re.I)]
    if not marks:
        keep = lines[-40:]
    else:
        chosen: list[int] = []
        for i in marks:
            for j in range(max(0, i - 2), min(len(lines), i + 4)):
                if not chosen or j > chosen[-1]:
                    chosen.append(j)
        keep = []
        prev = -1
        for j in chosen:
            if prev >= 0 and j > prev + 1:
                keep.append("...")
            keep.append(lines[j])
            prev = j
    out = "\n".join(keep)
    if len(out) > MAX_ERROR_CHARS:
        out = out[:MAX_ERROR_CHARS] + f"\n... ({len(out) - MAX_ERROR_CHARS} more characters)"
    return out


_RESOURCE_FAILURE = re.compile(r"Killed signal terminated|virtual memory exhausted|out of memory|"
                               r"Cannot allocate memory|No space left on device")


def _transient(res: CommandResult) -> bool:
    """A failure that a rerun on a healthier machine could turn into a success."""
    killed = res.returncode < 0 or res.returncode in (137, 143)  # a signal, directly or through sh
    return res.timed_out or killed or bool(_RESOURCE_FAILURE.search(res.output))


def _log_step(res: CommandResult) -> str:
    return (f"$ {' '.join(res.cmd)}\n{strip_include_trace(res.output)}"
            f"[{res.name}: exit {res.returncode}{' (timed out)' if res.timed_out else ''}, "
            f"{res.wall_s:.2f}s wall, {res.cpu_s:.2f}s cpu]\n\n")


def compile_cuda(cmd: list[str], workdir: Path, env: dict, config: BuildConfig, key: str, toolchain: Toolchain,
                 host_store: HostPchStore | None, may_start_header: bool = True) -> tuple[CommandResult, dict, dict]:
    """nvcc on cuda.cu: its two front ends in parallel when possible, else plain nvcc; the host
    compile on the precompiled prefix when there is one (`host_store` None: never). Returns the
    result, the chains' timings and notes: `nvcc` (split/plain), `host_pch` (used, rejected, failed,
    mismatch: see `HostPrefix.compile`; building, none, off: none offered; ready: offered, but nvcc
    stopped before its host compile). nvcc's intermediates stay in `workdir/nvcc`."""
    # With --threads the candidate asked nvcc to compile several archs at once; keep nvcc's way.
    wants_threads = any(f.startswith("--threads") for f in cmd)
    plan = plan_split(cmd, workdir, env) if config.split_nvcc and not wants_threads else None
    if plan is None:
        return (run_command("cuda", cmd, cwd=workdir, env=env, timeout_s=config.timeout_s, label=key), {},
                {"nvcc": "plain", "host_pch": "off"})
    mode = "use" if config.pch == "auto" and not may_start_header else config.pch
    prefix, offered = (None, "off") if host_store is None else host_store.for_build(
        host_store.key(toolchain, plan, workdir), toolchain, cmd, mode, config.timeout_s)
    run = run_split(plan, cmd, cwd=workdir, timeout_s=config.timeout_s, label=key, host_prefix=prefix)
    return run.result, run.timings, {"nvcc": "split", "host_pch": run.host_pch or offered}


def compile_extension(spec: ExtensionSpec, toolchain: Toolchain, key: str, workdir: Path,
                      config: BuildConfig, pch_store: PchStore | None,
                      host_store: HostPchStore | None = None) -> CompileOutcome:
    """Compile and link `spec` inside `workdir` (which must exist and be empty); the stores hold the
    precompiled headers (None: compile without)."""
    checked = spec.checked_flags()
    module = module_name_for(spec, key)
    library = f"{module}{toolchain.ext_suffix}"
    env = compiler_env(workdir)
    notes: dict = {}
    timings: dict = {}
    log: list[str] = []

    # Binding TU, optionally on top of the precompiled torch/extension.h.
    base = cxx_flags(spec, toolchain, checked)
    cpp_cmd = [toolchain.cxx, f"-DTORCH_EXTENSION_NAME={module}", *base]
    header = None
    if pch_store is None or config.pch == "off" or spec.no_implicit_headers:
        notes["pch"] = "off"
    else:
        pkey = pch_store.key(toolchain, base)
        header = pch_store.ready(pkey)
        if header is None and config.pch == "wait":
            header = pch_store.build(pkey, toolchain, base, config.timeout_s)
        elif header is None and not pch_store.failed(pkey) and headers_worth_building(spec):
            if pch_store.build_in_background(pkey, toolchain, base, config.timeout_s):
                notes["pch"] = "building"
        notes.setdefault("pch", "none")
        if header is not None:
            cpp_cmd += ["-include", str(header), "-Winvalid-pch", "-H"]
    if header is None and not spec.no_implicit_headers:
        cpp_cmd += ["-include", IMPLICIT_CPP_HEADER]
    cpp_cmd += ["-c", "main.cpp", "-o", "main.o"]
    (workdir / "main.cpp").write_text(cpp_translation_unit(
        spec.cpp_sources, spec.functions, spec.with_pytorch_error_handling))
    calls = {"cpp": lambda: run_command("cpp", cpp_cmd, cwd=workdir, env=env, timeout_s=config.timeout_s,
                                        label=key)}
    objects = ["main.o"]

    slimmed = False
    if spec.cuda_sources:
        text, slimmed = cuda_translation_unit(spec.cuda_sources, config.slim_cuda_headers)
        (workdir / "cuda.cu").write_text(text)
        notes["cuda_headers"] = "slim" if slimmed else "as written"
        cu_cmd = nvcc_command(spec, toolchain, checked, module)
        # A source without the implicit headers shares no prefix with others worth precompiling.
        cu_host_store = None if spec.no_implicit_headers else host_store

        def _cuda() -> CommandResult:
            result, cuda_timings, cuda_notes = compile_cuda(cu_cmd, workdir, env, config, key, toolchain,
                                                            cu_host_store, headers_worth_building(spec))
            timings.update(cuda_timings)
            notes.update(cuda_notes)
            return result

        calls["cuda"] = _cuda
        objects.append("cuda.cuda.o")

    results = in_parallel(calls)
    if header is not None:
        notes["pch"] = "used" if pch_used(results["cpp"].output) else "rejected"
    if slimmed and not results["cuda"].ok and not results["cuda"].timed_out \
            and MISSING_NAME.search(results["cuda"].output):
        # The slim header may lack a name the full one declares: rebuild exactly as written.
        log.append(_log_step(results["cuda"]))
        timings["cuda_slim"] = {"wall_s": round(results["cuda"].wall_s, 3),
                               "cpu_s": round(results["cuda"].cpu_s, 3)}
        text, _ = cuda_translation_unit(spec.cuda_sources, False)
        (workdir / "cuda.cu").write_text(text)
        notes["cuda_headers"] = "as written (slim failed)"
        results["cuda"] = _cuda()
    for res in results.values():
        log.append(_log_step(res))
        timings[res.name] = {"wall_s": round(res.wall_s, 3), "cpu_s": round(res.cpu_s, 3)}
    failed = [r for r in results.values() if not r.ok]
    if not failed:
        link = run_command("link", link_command(spec, toolchain, checked, objects, library), cwd=workdir,
                           env=env, timeout_s=config.timeout_s, label=key)
        log.append(_log_step(link))
        timings["link"] = {"wall_s": round(link.wall_s, 3), "cpu_s": round(link.cpu_s, 3)}
        if not link.ok:
            failed = [link]
    for obj in objects:
        (workdir / obj).unlink(missing_ok=True)
    shutil.rmtree(workdir / "nvcc", ignore_errors=True)  # nvcc intermediates (tens of MB)
    if failed:
        error = "\n".join(f"[{r.name}] " + ("timed out after {:.0f}s".format(config.timeout_s) if r.timed_out
                                             else trim_output(r.output, workdir, toolchain)) for r in failed)
        return CompileOutcome(False, module, None, error, "".join(log),
                              transient=any(_transient(r) for r in failed), timings=timings, notes=notes)
    return CompileOutcome(True, module, library, "", "".join(log), timings=timings, notes=notes)


def default_spec(toolchain: Toolchain) -> ExtensionSpec:
    """A candidate with default flags: CUDA where CUDA builds can succeed (nvcc and a CUDA torch)."""
    cuda = bool(toolchain.nvcc and toolchain.torch_cuda)
    return ExtensionSpec.from_load_inline_args(name="pch_default", cpp_sources="",
                                               cuda_sources="\n" if cuda else None)


def start_pch_builds(config: BuildConfig, toolchain: Toolchain | None = None) -> None:
    """Start building, in the background and at low priority, the precompiled headers a candidate with
    default flags uses (torch/extension.h; nvcc's host prefix where CUDA builds can happen), so the
    first one finds them ready. Runs no candidate code; `wait_for_background_pch` waits for it."""
    if config.pch == "off":
        return
    root = config.resolved_cache_dir()
    allow_reads(root)

    def torch_header():
        tc = toolchain or detect_toolchain(config.arch)
        spec = default_spec(tc)
        flags = cxx_flags(spec, tc, spec.checked_flags())
        store = PchStore(root / "pch")
        store.build(store.key(tc, flags), tc, flags, config.timeout_s, blocking=False)

    def host_prefix():
        tc = toolchain or detect_toolchain(config.arch)
        spec = default_spec(tc)
        if not spec.with_cuda or not config.split_nvcc:  # the prefix serves only split builds
            return
        cmd = nvcc_command(spec, tc, spec.checked_flags(), module_name_for(spec, "0" * 16))
        (root / "tmp").mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix="pch-plan.", dir=root / "tmp"))
        try:  # the dry run alone, for the key; the store probes in a directory of its own
            plan = plan_split(cmd, scratch, compiler_env(scratch))
            key = HostPchStore(root / "pch").key(tc, plan, scratch) if plan is not None else None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if key is not None:
            HostPchStore(root / "pch").build(key, tc, cmd, config.timeout_s, blocking=False)

    # The default flag sets' headers, asked for by the trusted pool itself: not counted against the
    # bounds on those candidates' flags start.
    start_in_background(root / "pch", "pch-default", torch_header, bounded=False)
    start_in_background(root / "pch", "pch-default-host", host_prefix, bounded=False)
