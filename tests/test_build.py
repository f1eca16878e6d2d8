"""The extension build layer: spec, flag policy, cache, PCH, parallel builds, nvcc step, loading.

C++ builds against torch headers take seconds of CPU each, so the tests share one cache directory
(and one precompiled header) through session fixtures and build only a handful of extensions.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from cuda_l1.evaluate.build import (BuildConfig, BuildError, BuildPool, CompileError, ExtensionSpec,
                                    build_extension, build_key, compiler_runs, detect_toolchain,
                                    load_built, load_built_path)
from cuda_l1.evaluate.build import parallel as pool_module
from cuda_l1.evaluate.build.compile import nvcc_command
from cuda_l1.evaluate.build.flags import check_cxx_flags, check_ldflags, check_nvcc_flags
from cuda_l1.evaluate.build.nvcc_split import plan_split, run_split
from cuda_l1.evaluate.build.procs import compiler_env, run_command
from cuda_l1.evaluate.build.translation_units import MISSING_NAME, cuda_translation_unit, slim_cuda_text

ADD_SRC = """
torch::Tensor add_scaled(torch::Tensor a, torch::Tensor b, double alpha) {
  return a + b * alpha;
}
"""

CUDA_SRC = r"""
#include <torch/extension.h>

__global__ void axpy_kernel(const float* x, const float* y, float* out, float a, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}

torch::Tensor axpy(torch::Tensor x, torch::Tensor y, double a) {
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  auto out = torch::empty_like(x);
  int64_t n = x.numel();
  axpy_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                         out.data_ptr<float>(), (float)a, n);
  return out;
}
"""

HAS_NVCC = detect_toolchain().nvcc is not None


@pytest.fixture(scope="session")
def config(tmp_path_factory) -> BuildConfig:
    return BuildConfig(cache_dir=tmp_path_factory.mktemp("builds"), pch="wait")


@pytest.fixture(scope="session")
def add_spec() -> ExtensionSpec:
    return ExtensionSpec.from_load_inline_args(name="add_ext", cpp_sources=ADD_SRC, functions=["add_scaled"])


@pytest.fixture(scope="session")
def add_built(add_spec, config):
    return build_extension(add_spec, config)


# --- building, loading, caching ------------------------------------------------------------------

def test_cpp_extension_builds_loads_and_computes(add_built):
    assert add_built.ok, add_built.error
    module = load_built(add_built)
    a, b = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(module.add_scaled(a, b, 0.5), a + b * 0.5)
    assert module.__name__ == add_built.module_name
    assert add_built.module_name.startswith("add_ext_")
    again = load_built_path(add_built.so_path, add_built.module_name)  # the form the child gets
    torch.testing.assert_close(again.add_scaled(a, b, 2.0), a + b * 2.0)


def test_binding_tu_uses_the_precompiled_header(add_built):
    assert add_built.notes["pch"] == "used"


def test_same_spec_again_is_a_cache_hit_without_compiling(add_spec, add_built, config):
    runs = compiler_runs(add_built.key)
    start = time.perf_counter()
    again = build_extension(add_spec, config)
    assert time.perf_counter() - start < 1.0
    assert again.cached and again.ok and again.so_path == add_built.so_path
    assert compiler_runs(add_built.key) == runs


def test_two_threads_building_one_new_spec_compile_it_once(config):
    spec = ExtensionSpec.from_load_inline_args(
        "twice", "torch::Tensor neg2(torch::Tensor a) { return -a; }", functions={"neg2": "negate"})
    results = []
    barrier = threading.Barrier(2)

    def worker():
        barrier.wait()
        results.append(build_extension(spec, config))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.ok for r in results] == [True, True]
    assert sorted(r.cached for r in results) == [False, True]
    assert compiler_runs(results[0].key) == 2  # one binding TU + one link
    assert "negate" in load_built(results[0]).neg2.__doc__
    torch.testing.assert_close(load_built(results[1]).neg2(torch.ones(2)), -torch.ones(2))


def test_compile_error_is_reported_usefully_and_cached(config):
    spec = ExtensionSpec.from_load_inline_args(
        "broken", "torch::Tensor f(torch::Tensor a) {\n  return a + not_declared_here;\n}", functions=["f"])
    first = build_extension(spec, config)
    assert not first.ok and not first.cached
    assert "not_declared_here" in first.error and "main.cpp:2" in first.error
    assert "/tmp/" not in first.error  # paths of the build directory are trimmed away
    runs = compiler_runs(first.key)
    second = build_extension(spec, config)
    assert second.cached and not second.ok and second.error == first.error
    assert compiler_runs(first.key) == runs
    with pytest.raises(CompileError, match="not_declared_here"):
        second.raise_for_error()
    with pytest.raises(ImportError):
        load_built(second)


def test_pool_shares_one_future_per_key_in_flight(monkeypatch, add_spec, config):
    release = threading.Event()
    calls = []

    def slow_build(spec, cfg, toolchain):
        calls.append(spec)
        release.wait(10)
        return "built"

    monkeypatch.setattr(pool_module, "build_extension", slow_build)
    with BuildPool(config, max_workers=2) as pool:
        first = pool.submit(add_spec)
        second = pool.submit(add_spec)
        other = pool.submit(ExtensionSpec.from_load_inline_args("other", ADD_SRC, functions=["add_scaled"]))
        assert isinstance(first, Future) and first is second and other is not first
        release.set()
        assert first.result(10) == "built" and other.result(10) == "built"
    assert len(calls) == 2


def test_pool_builds_for_real(add_spec, add_built, config):
    with BuildPool(config) as pool:
        result = pool.build(add_spec)
    assert result.ok and result.cached and result.key == add_built.key


# --- the cache key ---------------------------------------------------------------------------------

def test_key_follows_sources_and_flags_not_argument_order(config):
    tc = detect_toolchain()
    base = dict(name="k", cpp_sources=ADD_SRC, functions=["add_scaled"], extra_cflags=["-O2"])
    key = build_key(ExtensionSpec.from_load_inline_args(**base), tc, config)
    reordered = dict(reversed(list(base.items())))
    assert build_key(ExtensionSpec.from_load_inline_args(**reordered), tc, config) == key
    positional = ExtensionSpec.from_load_inline_args("k", ADD_SRC, None, None, ["add_scaled"], ["-O2"])
    assert build_key(positional, tc, config) == key
    changed_src = ExtensionSpec.from_load_inline_args(**{**base, "cpp_sources": ADD_SRC + "\n"})
    changed_flag = ExtensionSpec.from_load_inline_args(**{**base, "extra_cflags": ["-O3"]})
    assert build_key(changed_src, tc, config) != key
    assert build_key(changed_flag, tc, config) != key


# --- arguments and policy --------------------------------------------------------------------------

def test_load_inline_arguments_are_checked():
    with pytest.raises(BuildError, match="unexpected keyword"):
        ExtensionSpec.from_load_inline_args("x", "", bogus=1)
    with pytest.raises(BuildError, match="name"):
        ExtensionSpec.from_load_inline_args("not a name", "")
    with pytest.raises(BuildError, match="SYCL"):
        ExtensionSpec.from_load_inline_args("x", "", sycl_sources="int x;")
    with pytest.raises(BuildError, match="functions"):
        ExtensionSpec.from_load_inline_args("x", "", functions=3)
    with pytest.raises(BuildError, match="cpp_sources"):
        ExtensionSpec.from_load_inline_args("x", None)
    spec = ExtensionSpec.from_load_inline_args("x", ["a", "b"], cuda_sources="c", verbose=True,
                                               build_directory="/anywhere", use_pch=True, keep_intermediates=False)
    assert spec.with_cuda and spec.cpp_sources == ("a", "b") and spec.cuda_sources == ("c",)


def test_spec_survives_the_trip_through_a_dict_and_rechecks_it():
    spec = ExtensionSpec.from_load_inline_args("x", ADD_SRC, cuda_sources=CUDA_SRC, functions={"f": "doc"},
                                               extra_cuda_cflags=["-O3"])
    assert ExtensionSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    for bad in ({"name": "x"}, {"name": "x", "cpp_sources": "abc"}, {"name": "x", "cpp_sources": [], "evil": 1},
                {"name": "x", "cpp_sources": [], "with_cuda": "yes"},
                {"name": "x", "cpp_sources": [], "extra_cflags": ["-fplugin=a.so"]},
                {"name": "x", "cpp_sources": ['#include "/etc/passwd"']}, ["not", "a", "dict"]):
        with pytest.raises(BuildError):
            ExtensionSpec.from_dict(bad)


@pytest.mark.parametrize("flags", [
    ["-fplugin=evil.so"], ["-B/tmp/bin"], ["-wrapper", "gdb"], ["-specs=evil.specs"], ["@args.rsp"],
    ["-o", "/tmp/out.o"], ["-save-temps"], ["-include", "/etc/passwd"], ["-imacros", "../../secret.h"],
    ["-I/home"], ["-Wl,-rpath,/tmp"], ["-Xlinker", "-T"], ["-lssl"], ["-L/tmp"], ["-O3 -fplugin=x.so"],
])
def test_dangerous_c_flags_are_refused(flags):
    with pytest.raises(BuildError):
        ExtensionSpec.from_load_inline_args("x", "", extra_cflags=flags)


@pytest.mark.parametrize("flags", [
    ["-ccbin", "/tmp/cc"], ["--compiler-bindir=/tmp"], ["-Xcompiler", "-fplugin=x.so"], ["-arch=sm_9999"],
    ["-gencode", "arch=compute_90,code=/tmp/x"], ["-Xptxas", "-o,/tmp/x"], ["--output-directory", "/tmp"],
    ["-odir", "/tmp"], ["-rdc=true"], ["--keep"], ["-Xnvlink", "-T"], ["-Xcompiler", "-Wl,-T,x"],
    ["-DX=$(touch pwned)"], ["-DY=`id`"], ["-Xcompiler", "-DZ=$(id)"], ['-DQ="a b"'], ["-Iinc;id"],
])
def test_dangerous_nvcc_flags_are_refused(flags):
    with pytest.raises(BuildError):
        ExtensionSpec.from_load_inline_args("x", "", cuda_sources="int y;", extra_cuda_cflags=flags)


@pytest.mark.parametrize("flags", [["-Wl,--script=x.ld"], ["-lfoo"], ["-L/home/user"], ["-T", "x.ld"]])
def test_dangerous_ldflags_are_refused(flags):
    with pytest.raises(BuildError):
        ExtensionSpec.from_load_inline_args("x", "", extra_ldflags=flags)


def test_usual_flags_pass():
    tc = detect_toolchain()
    cxx = check_cxx_flags(["-O3", "-std=c++17", "-ffast-math", "-march=native", "-DNDEBUG", "-UFOO",
                           "-Wall", "-fopenmp", "-Iinclude"], include_roots=tc.include_roots())
    assert "-O3" in cxx.compile and "-fopenmp" in cxx.link
    nv = check_nvcc_flags(["-O3", "--use_fast_math", "-use_fast_math", "-lineinfo", "-Xptxas -v,-O3",
                           "--expt-relaxed-constexpr", "--extended-lambda", "-maxrregcount=64",
                           "-gencode arch=compute_90a,code=sm_90a", "-arch=sm_90", "-std=c++17",
                           "-Xcompiler -O3,-fopenmp", "-DUSE_X=1", "-lcublas", "--ftz=true"])
    assert "-lcublas" in nv.link and "-gencode=arch=compute_90a,code=sm_90a" in nv.compile
    assert check_ldflags(["-lcublas", "-lcublasLt", "-lcurand", "-lcusparse", "-lcufft"]) == (
        "-lcublas", "-lcublasLt", "-lcurand", "-lcusparse", "-lcufft")
    cuda_lib = tc.cuda_lib
    if cuda_lib:
        assert check_ldflags([f"-L{cuda_lib}"], lib_roots=tc.lib_roots()) == (f"-L{cuda_lib}",)
    ExtensionSpec.from_load_inline_args("x", "", extra_cflags=["-O3 -DX=1", '-DNAME="a b"'],
                                        extra_include_paths=[tc.torch_includes[0]])


@pytest.mark.parametrize("source", [
    '#include "/etc/passwd"', '#include "../../secrets.h"', "#  include </home/user/.ssh/id_rsa>",
    "#define F <x.h>\n#include F", 'asm(".incbin \\"/etc/passwd\\"");', 'asm(".inc" "bin \\"/x\\"");',
    '__asm__(".include \\"/etc/shadow\\"");', "#if __has_include(\"/etc/passwd\")\n#endif",
    "#include_next </etc/hosts>", '#pragma GCC dependency "/etc/passwd"',
])
def test_sources_that_read_files_while_compiling_are_refused(source):
    with pytest.raises(BuildError):
        ExtensionSpec.from_load_inline_args("x", source)


def test_ordinary_sources_pass():
    ptx = '\nasm volatile("mov.u32 %0, %%laneid;" : "=r"(x));'
    spec = ExtensionSpec.from_load_inline_args("x", "#include <vector>\n#include \"local.h\"\n" + ADD_SRC,
                                               cuda_sources=CUDA_SRC + ptx)
    assert spec.with_cuda


# --- the CUDA translation unit ---------------------------------------------------------------------

def test_cuda_headers_are_slimmed_only_when_safe():
    slim, changed = slim_cuda_text(CUDA_SRC)
    assert changed and "#include <torch/types.h>" in slim and slim.count("\n") == CUDA_SRC.count("\n")
    for needs_full in ["py::object f();", "torch::nn::functional::relu(x);", "PYBIND11_MODULE(m, m) {}",
                       "PyObject* p;", "torch::cuda::synchronize();"]:
        assert not slim_cuda_text(CUDA_SRC + needs_full)[1], needs_full
    assert slim_cuda_text(CUDA_SRC + "// a PyTorch extension\n")[1]
    assert not slim_cuda_text("__global__ void k() {}")[1]
    assert MISSING_NAME.search('error: namespace "torch" has no member "nn"')
    assert MISSING_NAME.search("error: 'py' has not been declared")


def _nm(path):
    out = subprocess.run(["nm", "--defined-only", str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


@pytest.mark.skipif(not HAS_NVCC or shutil.which("nm") is None, reason="needs nvcc and nm")
def test_cuda_source_compiles_to_an_object_split_and_plain(tmp_path):
    tc = detect_toolchain("9.0a")
    spec = ExtensionSpec.from_load_inline_args(
        "tiny", "", cuda_sources="__global__ void tiny_kernel(float* x) { x[threadIdx.x] *= 2.0f; }\n"
                                 "void launch(float* x) { tiny_kernel<<<1, 32>>>(x); }\n",
        no_implicit_headers=True, extra_cuda_cflags=["-O3", "-lineinfo"])
    text, _ = cuda_translation_unit(spec.cuda_sources, slim=True)
    objects = {}
    for mode in ("plain", "split"):
        work = tmp_path / mode
        work.mkdir()
        (work / "cuda.cu").write_text(text)
        cmd = nvcc_command(spec, tc, spec.checked_flags(), "tiny_mod")
        assert "-gencode=arch=compute_90a,code=sm_90a" in cmd
        env = compiler_env(work)
        if mode == "plain":
            res = run_command("cuda", cmd, cwd=work, env=env, timeout_s=300, label="nvcc-test")
        else:
            plan = plan_split(cmd, work, env)
            assert plan is not None, "nvcc --dryrun had an unknown shape"
            res, timings, host_pch = run_split(plan, cmd, cwd=work, timeout_s=300, label="nvcc-test")
            assert host_pch is None  # no precompiled prefix offered
            assert set(timings) == {"cuda_host_front", "cuda_device", "cuda_host_compile"}
        assert res.ok, res.output
        objects[mode] = _nm(work / "cuda.cuda.o")
    assert any("tiny_kernel" in s for s in objects["split"])
    # Same symbols, apart from nvcc's per-module id inside anonymous-namespace names.
    assert {s for s in objects["split"] if "GLOBAL__N" not in s and "sub_I" not in s} == \
           {s for s in objects["plain"] if "GLOBAL__N" not in s and "sub_I" not in s}


@pytest.mark.skipif(not HAS_NVCC, reason="needs nvcc")
def test_cuda_compile_error_reads_like_nvcc(tmp_path):
    spec = ExtensionSpec.from_load_inline_args(
        "bad", "", cuda_sources="__global__ void k(float* x) {\n  x[0] = undefined_thing;\n}\n",
        no_implicit_headers=True)
    text, _ = cuda_translation_unit(spec.cuda_sources, slim=False)
    (tmp_path / "cuda.cu").write_text(text)
    cmd = nvcc_command(spec, detect_toolchain("9.0a"), spec.checked_flags(), "bad_mod")
    plan = plan_split(cmd, tmp_path, compiler_env(tmp_path))
    assert plan is not None
    res = run_split(plan, cmd, cwd=tmp_path, timeout_s=300, label="nvcc-test").result
    assert not res.ok and 'cuda.cu(2): error: identifier "undefined_thing" is undefined' in res.output
    assert res.output.count("error: identifier") == 1  # the device chain's copy is not shown twice


@pytest.mark.gpu
def test_cuda_extension_builds_loads_and_runs_on_gpu(config):
    spec = ExtensionSpec.from_load_inline_args(
        name="axpy_ext", cpp_sources="torch::Tensor axpy(torch::Tensor x, torch::Tensor y, double a);",
        cuda_sources=CUDA_SRC, functions=["axpy"], extra_cuda_cflags=["-O3"])
    result = build_extension(spec, BuildConfig(cache_dir=config.cache_dir, pch="off"))
    assert result.ok, result.error
    assert result.notes["cuda_headers"] == "slim" and result.notes["nvcc"] == "split"
    assert result.notes["pch"] == result.notes["host_pch"] == "off"
    module = load_built(result)
    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    torch.testing.assert_close(module.axpy(x, y, 2.0), 2.0 * x + y)


@pytest.mark.gpu
def test_cuda_extension_built_on_both_precompiled_headers_runs_on_gpu(config):
    spec = ExtensionSpec.from_load_inline_args(
        name="axpy_pch_ext", cpp_sources="torch::Tensor axpy(torch::Tensor x, torch::Tensor y, double a);",
        cuda_sources=CUDA_SRC, functions=["axpy"])
    result = build_extension(spec, config)  # "wait": both headers are built first
    assert result.ok, result.error
    assert result.notes["pch"] == result.notes["host_pch"] == "used"
    module = load_built(result)
    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    torch.testing.assert_close(module.axpy(x, y, 3.0), 3.0 * x + y)


SHARED_ID_SRC = r"""
#include <torch/extension.h>
namespace {
__constant__ float factor[1];
__device__ float offset_value = OFFSET;
__global__ void affine_kernel(const float* x, float* out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = factor[0] * x[i] + offset_value;
}
}  // namespace

torch::Tensor affine(torch::Tensor x) {
  float f = FACTOR;
  TORCH_CHECK(cudaMemcpyToSymbol(factor, &f, sizeof(float)) == cudaSuccess, "cudaMemcpyToSymbol");
  auto out = torch::empty_like(x);
  int64_t n = x.numel();
  affine_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
  return out;
}
"""


@pytest.mark.gpu
def test_two_extensions_with_one_nvcc_module_id_run_side_by_side(tmp_path):
    """Every split build names the same nvcc module id (so the host compile can share one precompiled
    prefix): two extensions whose anonymous-namespace device symbols then have the same names must
    still each reach their own, loaded in one process and called in turn."""
    from cuda_l1.evaluate.build.nvcc_split import MODULE_ID

    pool = BuildPool(BuildConfig(cache_dir=tmp_path, pch="off"))
    specs = [ExtensionSpec.from_load_inline_args(
        name=f"affine_{tag}", cpp_sources="torch::Tensor affine(torch::Tensor x);",
        cuda_sources=SHARED_ID_SRC.replace("FACTOR", factor).replace("OFFSET", offset), functions=["affine"])
        for tag, factor, offset in (("a", "2.0f", "1.0f"), ("b", "3.0f", "-1.0f"))]
    try:
        results = [f.result(timeout=600) for f in [pool.submit(s) for s in specs]]
    finally:
        pool.shutdown(wait=True)
    assert all(r.ok for r in results), [r.error for r in results]
    assert all(r.notes["nvcc"] == "split" for r in results)
    assert all(MODULE_ID.encode() in Path(r.so_path).read_bytes() for r in results)  # the id is in both
    a, b = (load_built(r) for r in results)
    x = torch.randn(1 << 16, device="cuda")
    for _ in range(2):
        torch.testing.assert_close(a.affine(x), 2.0 * x + 1.0)
        torch.testing.assert_close(b.affine(x), 3.0 * x - 1.0)


def test_cancelled_compilers_end_at_once_and_are_no_failure(tmp_path):
    """An interrupted owner kills its compilers (procs.cancel_running): they end at once, and nothing
    treats them as a verdict on the code (no failed marker on a precompiled header, nothing cached)."""
    from cuda_l1.evaluate.build import procs
    from cuda_l1.evaluate.build.pch import PchStore

    done: dict = {}
    runner = threading.Thread(target=lambda: done.setdefault("result", procs.run_command(
        "pch", ["sleep", "30"], cwd=tmp_path, env=procs.compiler_env(tmp_path), timeout_s=60, label="cancel-test")))
    runner.start()
    deadline = time.monotonic() + 10
    while not procs._live and time.monotonic() < deadline:
        time.sleep(0.02)
    assert procs.cancel_running() >= 1
    runner.join(10)
    result = done["result"]
    assert result.cancelled and not result.ok and not result.timed_out and result.wall_s < 10
    store = PchStore(tmp_path / "pch")
    assert store.build_once("k", lambda kdir, hdr, tmp, nice: [result], blocking=True) is None
    assert not store.failed("k")  # the next build of this flag set tries again


def test_only_common_flags_start_a_header_build(tmp_path):
    """A candidate's own -D (unique per candidate if it likes) uses a precompiled header that exists
    but starts none: each costs a compile of torch's headers and hundreds of megabytes."""
    from cuda_l1.evaluate.build import pch
    from cuda_l1.evaluate.build.compile import headers_worth_building

    def spec(**flags):
        return ExtensionSpec.from_load_inline_args(name="add_ext", cpp_sources=ADD_SRC, functions=["add_scaled"],
                                                   **flags)

    assert headers_worth_building(spec()) and headers_worth_building(spec(extra_cflags=["-O3", "-std=c++17"]))
    assert headers_worth_building(spec(extra_cuda_cflags=["-O3", "--use_fast_math", "-lineinfo"]))
    assert not headers_worth_building(spec(extra_cflags=["-O3 -DSALT=7349120"]))
    assert not headers_worth_building(spec(extra_cflags=["-O2", "-O2"]))  # one more key per repeat
    result = build_extension(spec(extra_cflags=["-DSALT=7349120"]), BuildConfig(cache_dir=tmp_path, pch="auto"))
    assert result.ok, result.error
    assert result.notes["pch"] == "none"
    assert not any(t.is_alive() for t in pch._background) and not list((tmp_path / "pch").glob("*/*.gch"))


def test_background_header_builds_are_bounded(monkeypatch, tmp_path):
    """However many flag sets candidates ask for, a process runs at most two header builds at once and
    starts at most MAX_BACKGROUND_STARTED in all (each is a compile of torch's headers)."""
    from cuda_l1.evaluate.build import pch

    monkeypatch.setattr(pch, "_background", [])
    release = threading.Event()
    store = tmp_path / "pch"
    assert pch.start_in_background(store, "a", release.wait) and pch.start_in_background(store, "b", release.wait)
    assert not pch.start_in_background(store, "c", release.wait)  # two are running
    release.set()
    pch.wait_for_background_pch(10)
    started = 0
    for i in range(20):
        started += pch.start_in_background(store, f"n{i}", lambda: None)
        pch.wait_for_background_pch(10)
    assert 2 + started == pch.MAX_BACKGROUND_STARTED
    assert pch.start_in_background(tmp_path / "another", "d", lambda: None)  # counted by store


def test_compilers_are_held_to_a_file_size_and_their_output_to_its_ends(tmp_path):
    """A source decides what its compilers write: a file past the limit ends the command, and of an
    output flood only the first and last part reach this process, with a line saying what was cut."""
    from cuda_l1.evaluate.build import procs

    env = procs.compiler_env(tmp_path)
    big = run_command("big", [sys.executable, "-c", "open('out.bin', 'wb').write(bytes(3 << 20))"],
                      cwd=tmp_path, env=env, timeout_s=60, label="fsize-test", file_bytes=1 << 20)
    assert not big.ok and (tmp_path / "out.bin").stat().st_size <= 1 << 20
    small = run_command("small", [sys.executable, "-c", "open('out.bin', 'wb').write(bytes(3 << 19))"],
                        cwd=tmp_path, env=env, timeout_s=60, label="fsize-test", file_bytes=1 << 21)
    assert small.ok, small.output
    hog = run_command("hog", [sys.executable, "-c", f"b = bytearray({procs.MEMORY_BYTES + (1 << 30)})"],
                      cwd=tmp_path, env=env, timeout_s=60, label="as-test")
    assert not hog.ok and "MemoryError" in hog.output
    flood = run_command("flood", [sys.executable, "-c", "import sys\nfor i in range(200000): "
                                  "sys.stdout.write(f'line {i:06d} ' + 'x' * 40 + chr(10))"],
                        cwd=tmp_path, env=env, timeout_s=60, label="flood-test")
    assert flood.ok
    assert len(flood.output) < procs.OUTPUT_HEAD_BYTES + procs.OUTPUT_TAIL_BYTES + 200
    assert flood.output.startswith("line 000000") and flood.output.rstrip().endswith("x" * 40)
    assert "line 199999" in flood.output and "bytes of compiler output left out" in flood.output


def test_a_jailed_compiler_is_taken_before_the_evaluator_on_a_host_out_of_memory(tmp_path):
    """The OOM killer's score of a compiler is 500: after the sides (1000), before the evaluator (0)."""
    import subprocess
    import sys

    from cuda_l1.evaluate.build.procs import jailed

    cmd = jailed(["cat", "/proc/self/oom_score_adj"], tmp_path, {})
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    ours = int(open("/proc/self/oom_score_adj").read())
    assert out.returncode == 0 and int(out.stdout) == max(ours, 500), (out.stdout, out.stderr)
