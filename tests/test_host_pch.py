"""nvcc's host compile on a precompiled prefix (build/host_pch.py): the same object, and every way
back to compiling the text as nvcc would.

The module shares one store (probe and PCH build, ~40 s on 2 cores) and one candidate's nvcc front
ends (~20 s); each test then redoes only the host compile, on a copy of that candidate's
intermediates.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from types import SimpleNamespace

import pytest

from cuda_l1.evaluate.build import BuildConfig, BuildPool, ExtensionSpec, detect_toolchain, wait_for_background_pch
from cuda_l1.evaluate.build.ahead import Prebuilder
from cuda_l1.evaluate.build.compile import compile_cuda, cxx_flags, default_spec, nvcc_command, start_pch_builds
from cuda_l1.evaluate.build.host_pch import PREFIX_HEADER, HostPchStore, HostPrefix
from cuda_l1.evaluate.build.nvcc_split import MODULE_ID, plan_split, run_host_compile
from cuda_l1.evaluate.build.pch import PchStore
from cuda_l1.evaluate.build.procs import allow_reads, compiler_env
from cuda_l1.evaluate.build.translation_units import cuda_translation_unit
from cuda_l1.evaluate.config import EvalConfig

HAS_NVCC = detect_toolchain().nvcc is not None
needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="needs nvcc")

# Torch, an anonymous namespace with device symbols, a kernel launch: what candidates look like.
AFFINE_SRC = r"""
#include <torch/extension.h>
namespace {
__device__ float offset_value = 1.0f;
__global__ void affine_kernel(const float* x, float* out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * x[i] + offset_value;
}
}  // namespace

torch::Tensor affine(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  auto out = torch::empty_like(x);
  int64_t n = x.numel();
  affine_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
  return out;
}
"""
CUDAFE_OUTPUT = "nvcc/cuda.cudafe1.cpp"


def _spec(flags=()) -> ExtensionSpec:
    return ExtensionSpec.from_load_inline_args(name="affine", cpp_sources="", cuda_sources=AFFINE_SRC,
                                               extra_cuda_cflags=list(flags))


def _prepare(work, flags=(), module="affine_mod"):
    """cuda.cu in `work`, the nvcc command and its split plan."""
    spec = _spec(flags)
    work.mkdir(parents=True, exist_ok=True)
    (work / "cuda.cu").write_text(cuda_translation_unit(spec.cuda_sources, True)[0])
    cmd = nvcc_command(spec, detect_toolchain("9.0a"), spec.checked_flags(), module)
    return cmd, plan_split(cmd, work, compiler_env(work))


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """The store built by the first build ("wait"), and that build's intermediates and object."""
    if not HAS_NVCC:
        pytest.skip("needs nvcc")
    root = tmp_path_factory.mktemp("host_pch")
    allow_reads(root)
    tc = detect_toolchain("9.0a")
    store = HostPchStore(root / "pch")
    work = root / "candidate"
    cmd, _ = _prepare(work)
    result, timings, notes = compile_cuda(cmd, work, compiler_env(work), BuildConfig(cache_dir=root, pch="wait"),
                                          "host-pch-test", tc, store)
    assert result.ok, result.output
    return SimpleNamespace(tc=tc, store=store, cmd=cmd, work=work, notes=notes, timings=timings,
                           object=(work / "cuda.cuda.o").read_bytes(), text=(work / CUDAFE_OUTPUT).read_bytes())


def _redo(case, where, prefix):
    """The candidate's host compile again, on a copy of its intermediates."""
    shutil.copytree(case.work, where)
    (where / "cuda.cuda.o").unlink()
    plan = plan_split(case.cmd, where, compiler_env(where))
    result, outcome = run_host_compile(plan, cwd=where, timeout_s=600, label="host-pch-test", host_prefix=prefix)
    return result, outcome


def _store_prefix(case) -> bytes:
    key = case.store.key(case.tc, plan_split(case.cmd, case.work, compiler_env(case.work)), case.work)
    return (case.store.prefix(key).header).read_bytes()


def test_a_waiting_build_makes_the_prefix_first_and_compiles_on_it(case):
    assert case.notes == {"nvcc": "split", "host_pch": "used"}
    prefix = _store_prefix(case)
    assert len(prefix) > 1_000_000 and case.text.startswith(prefix) and len(case.text) > len(prefix)
    # The store's prefix ends before the candidate's own code; its text is back in place after the build.
    assert b"affine_kernel" not in prefix and b"affine_kernel" in case.text[len(prefix):]
    assert MODULE_ID.encode() in case.object  # the one module id names the anonymous namespace


def test_the_object_is_byte_identical_to_the_host_compile_without_the_prefix(case, tmp_path):
    result, outcome = _redo(case, tmp_path / "plain", None)
    assert result.ok, result.output
    assert outcome is None
    assert (tmp_path / "plain" / "cuda.cuda.o").read_bytes() == case.object


def test_text_that_does_not_start_with_the_prefix_compiles_as_before(case, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    prefix = bytearray(_store_prefix(case))
    prefix[len(prefix) // 2] ^= 1  # another candidate's prefix (other flags, other headers)
    (other / PREFIX_HEADER).write_bytes(bytes(prefix))
    result, outcome = _redo(case, tmp_path / "work", HostPrefix(other / PREFIX_HEADER))
    assert outcome == "mismatch"
    assert result.ok, result.output
    assert (tmp_path / "work" / "cuda.cuda.o").read_bytes() == case.object
    assert (tmp_path / "work" / CUDAFE_OUTPUT).read_bytes() == case.text


def test_a_pch_gcc_does_not_load_is_rejected_and_the_text_compiles_as_before(case, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    allow_reads(broken)  # confined compilers read only the build cache's stores
    (broken / PREFIX_HEADER).write_bytes(_store_prefix(case))
    (broken / (PREFIX_HEADER + ".gch")).write_bytes(b"not a precompiled header\n" * 64)
    result, outcome = _redo(case, tmp_path / "work", HostPrefix(broken / PREFIX_HEADER))
    assert outcome == "rejected"
    assert result.ok, result.output
    assert (tmp_path / "work" / "cuda.cuda.o").read_bytes() == case.object
    assert (tmp_path / "work" / CUDAFE_OUTPUT).read_bytes() == case.text
    assert "not a PCH file" in (broken / "failed").read_text()  # and never offered again (next test)


def test_a_host_compile_error_reads_exactly_as_without_the_prefix(case, tmp_path):
    # An error only the host compiler sees (cudafe++ lets it through), after the candidate's code.
    error_line = b'\n# 40 "cuda.cu"\nstatic_assert(sizeof(int) == 3, "only the host compiler says so");\n'
    outputs = {}
    for mode, prefix in (("plain", None), ("prefix", case.store.prefix(
            case.store.key(case.tc, plan_split(case.cmd, case.work, compiler_env(case.work)), case.work)))):
        work = tmp_path / mode
        shutil.copytree(case.work, work)
        (work / CUDAFE_OUTPUT).write_bytes(case.text + error_line)
        plan = plan_split(case.cmd, work, compiler_env(work))
        result, outcome = run_host_compile(plan, cwd=work, timeout_s=600, label="host-pch-test", host_prefix=prefix)
        assert not result.ok
        outputs[mode] = result.output
        if prefix is not None:
            assert outcome == "failed"
    assert "cuda.cu:40" in outputs["plain"] and "only the host compiler says so" in outputs["plain"]
    assert outputs["prefix"] == outputs["plain"]
    assert not any(line.startswith(("! ", ". ")) for line in outputs["prefix"].splitlines())  # no -H trace


@needs_nvcc
def test_the_store_key_follows_what_changes_the_prefix_not_the_directory_or_module(tmp_path):
    tc = detect_toolchain("9.0a")
    store = HostPchStore(tmp_path / "pch")

    def key(name, flags=(), module="affine_mod"):
        work = tmp_path / name
        return store.key(tc, _prepare(work, flags, module)[1], work)

    base = key("a")
    assert key("b", module="another_mod") == base
    assert key("fast", ["--use_fast_math", "-lineinfo"]) == base  # device-only flags share the prefix
    assert len({base, key("ndebug", ["-DNDEBUG"]), key("o3", ["-O3"]), key("std", ["-std=c++17"])}) == 4


def _pch_threads():
    return {t for t in threading.enumerate() if t.name.startswith("pch-")}


@needs_nvcc
def test_off_and_failed_prefixes_are_never_offered(case, tmp_path):
    key = case.store.key(case.tc, plan_split(case.cmd, case.work, compiler_env(case.work)), case.work)
    prefix, note = case.store.for_build(key, case.tc, case.cmd, "auto", 60)
    assert note == "ready" and prefix is not None
    assert case.store.for_build(key, case.tc, case.cmd, "off", 60) == (None, "off")
    before = _pch_threads()
    for built in (False, True):  # a probe or PCH build that failed; a PCH that gcc rejected
        failed = HostPchStore(tmp_path / str(built))
        kdir = tmp_path / str(built) / key
        kdir.mkdir(parents=True)
        if built:
            (kdir / PREFIX_HEADER).write_bytes(b"")
            (kdir / (PREFIX_HEADER + ".gch")).write_bytes(b"")
        (kdir / "failed").write_text("gcc said no")
        for mode in ("auto", "wait"):
            assert failed.for_build(key, case.tc, case.cmd, mode, 60) == (None, "none")
    assert _pch_threads() == before  # no background build of a prefix that failed once


# --- both precompiled headers built before the first candidate --------------------------------------


@pytest.fixture
def recorded_builds(monkeypatch):
    """PCH builds recorded instead of run (each takes ~20-50 s of CPU)."""
    calls = []

    def torch_pch(self, key, toolchain, flags, timeout_s, blocking=True):
        time.sleep(0.5)  # long enough that a caller who does not wait finds it unfinished
        calls.append(("torch", key, list(flags), blocking))

    def host_pch(self, key, toolchain, nvcc_cmd, timeout_s, blocking=True):
        time.sleep(0.5)
        calls.append(("host", key, list(nvcc_cmd), blocking))

    monkeypatch.setattr(PchStore, "build", torch_pch)
    monkeypatch.setattr(HostPchStore, "build", host_pch)
    return calls


def test_without_cuda_only_the_binding_header_is_built_ahead(recorded_builds, tmp_path):
    tc = dataclasses.replace(detect_toolchain(), nvcc=None, nvcc_version=None, torch_cuda=None)
    start_pch_builds(BuildConfig(cache_dir=tmp_path), tc)
    wait_for_background_pch()
    spec = default_spec(tc)
    flags = cxx_flags(spec, tc, spec.checked_flags())
    assert not spec.with_cuda
    assert recorded_builds == [("torch", PchStore(tmp_path / "pch").key(tc, flags), flags, False)]


@needs_nvcc
def test_with_cuda_both_headers_are_built_ahead_for_the_default_flags(recorded_builds, tmp_path):
    tc = dataclasses.replace(detect_toolchain("9.0a"), torch_cuda="13.0")  # as if torch were a CUDA build
    start_pch_builds(BuildConfig(cache_dir=tmp_path), tc)
    wait_for_background_pch()
    spec = default_spec(tc)
    assert spec.with_cuda
    # The key a candidate with default flags computes for itself.
    work = tmp_path / "candidate"
    work.mkdir()
    cmd = nvcc_command(_spec(), tc, _spec().checked_flags(), "some_candidate")
    host_key = HostPchStore(tmp_path / "pch").key(tc, plan_split(cmd, work, compiler_env(work)), work)
    assert sorted((kind, key, blocking) for kind, key, _, blocking in recorded_builds) == [
        ("host", host_key, False), ("torch", PchStore(tmp_path / "pch").key(tc, cxx_flags(spec, tc, spec.checked_flags())),
                                    False)]
    assert not list((tmp_path / "tmp").iterdir())  # the dry run's scratch directory is gone


def test_pch_off_builds_nothing_ahead(recorded_builds, tmp_path):
    start_pch_builds(BuildConfig(cache_dir=tmp_path, pch="off"), detect_toolchain())
    wait_for_background_pch()
    assert recorded_builds == []


def test_a_pool_starts_the_headers_and_waits_for_them_on_shutdown(recorded_builds, tmp_path):
    pool = BuildPool(BuildConfig(cache_dir=tmp_path))
    assert recorded_builds == []  # building in the background
    pool.shutdown()
    assert [kind for kind, *_ in recorded_builds].count("torch") == 1


def test_an_evaluators_prebuilder_starts_the_headers_before_any_candidate(recorded_builds, tmp_path):
    prebuilder = Prebuilder(EvalConfig(build_cache_dir=str(tmp_path)))
    prebuilder.close()  # no candidate came; it still waits for the headers' compilers
    assert [kind for kind, *_ in recorded_builds].count("torch") == 1
