"""How long one `load_inline`-style extension takes to build: this project's build layer vs stock.

Measures, for a representative candidate (one CUDA elementwise kernel plus one bound function,
the CUDA source including <torch/extension.h> as candidates write it):
  cold_pchs_building      fresh cache directory: neither precompiled header (torch/extension.h for
                          the binding TU, nvcc's host prefix for the .cu) is built yet; the build
                          starts them in the background and compiles without (default config)
  cold_source_pchs_ready  both precompiled headers built, source never built before: what a
                          candidate meets once the evaluator has started (it builds both at start)
  cached                  the same source again
  stock_load_inline       torch.utils.cpp_extension.load_inline in a fresh TORCH_EXTENSIONS_DIR
Each build's `detail` holds its steps' times and its notes (`pch`, `host_pch`: used or why not).
Without a GPU (no CUDA torch to link against) it measures the C++-only variant of the candidate
and says so in the JSON; `--cuda-object` adds the `.cu` -> object compile alone, which works
wherever nvcc is installed (as written vs slim headers, plain vs split nvcc, split with the host
prefix precompiled, whose one-time build it times too); `--no-builds` measures only that.

    python benchmarks/compile_time.py --out benchmarks/results/compile_time_h200.json --repeats 3
    python benchmarks/compile_time.py --out cu.json --no-builds --cuda-object --object-variants slim_split,slim_split_host_pch
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

from cuda_l1.evaluate.build import (BuildConfig, ExtensionSpec, build_extension, detect_toolchain, load_built,
                                    wait_for_background_pch)
from cuda_l1.evaluate.build.compile import nvcc_command
from cuda_l1.evaluate.build.host_pch import HostPchStore
from cuda_l1.evaluate.build.nvcc_split import plan_split, run_split
from cuda_l1.evaluate.build.procs import allow_reads, compiler_env, run_command
from cuda_l1.evaluate.build.translation_units import cuda_translation_unit

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void scale_add_kernel(const float* __restrict__ x, const float* __restrict__ y,
                                 float* __restrict__ out, float alpha, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = alpha * x[i] + y[i];
}

torch::Tensor scale_add(torch::Tensor x, torch::Tensor y, double alpha) {
  TORCH_CHECK(x.is_cuda() && y.is_cuda(), "inputs must be CUDA tensors");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 only");
  auto xc = x.contiguous();
  auto yc = y.contiguous();
  auto out = torch::empty_like(xc);
  int64_t n = xc.numel();
  const int threads = 256;
  const int blocks = (int)((n + threads - 1) / threads);
  scale_add_kernel<<<blocks, threads>>>(xc.data_ptr<float>(), yc.data_ptr<float>(),
                                        out.data_ptr<float>(), (float)alpha, n);
  return out;
}
"""
CUDA_DECL = "torch::Tensor scale_add(torch::Tensor x, torch::Tensor y, double alpha);"
# The same operation for machines without CUDA torch: a C++ loop plus the binding.
CPP_SOURCE = r"""
torch::Tensor scale_add(torch::Tensor x, torch::Tensor y, double alpha) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 only");
  auto xc = x.contiguous();
  auto yc = y.contiguous();
  auto out = torch::empty_like(xc);
  const float* px = xc.data_ptr<float>();
  const float* py = yc.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t i = 0; i < xc.numel(); ++i) po[i] = (float)alpha * px[i] + py[i];
  return out;
}
"""


def load_inline_args(variant: str, salt: str) -> dict:
    """Arguments of the candidate's load_inline call; `salt` makes the source new to every cache."""
    name = f"scale_add_{salt}"
    if variant == "cuda":
        return dict(name=name, cpp_sources=CUDA_DECL, cuda_sources=CUDA_SOURCE + f"// {salt}\n",
                    functions=["scale_add"])
    return dict(name=name, cpp_sources=CPP_SOURCE + f"// {salt}\n", functions=["scale_add"])


def check_module(module, variant: str) -> None:
    device = "cuda" if variant == "cuda" else "cpu"
    x, y = torch.randn(4096, device=device), torch.randn(4096, device=device)
    torch.testing.assert_close(module.scale_add(x, y, 0.5), 0.5 * x + y)


def summary(runs: list[float]) -> dict:
    return {"runs_s": [round(r, 6) for r in runs], "median_s": round(statistics.median(runs), 6)}


def ours(variant: str, cache_dir: Path, salt: str) -> tuple[float, dict]:
    spec = ExtensionSpec.from_load_inline_args(**load_inline_args(variant, salt))
    start = time.perf_counter()
    result = build_extension(spec, BuildConfig(cache_dir=cache_dir))
    elapsed = time.perf_counter() - start
    result.raise_for_error()
    check_module(load_built(result), variant)
    return elapsed, {"steps": result.timings, "notes": result.notes, "cached": result.cached}


def stock(variant: str, salt: str) -> float:
    from torch.utils.cpp_extension import load_inline

    ext_dir = tempfile.mkdtemp(prefix="stock-ext-")
    old = os.environ.get("TORCH_EXTENSIONS_DIR")
    os.environ["TORCH_EXTENSIONS_DIR"] = ext_dir
    try:
        start = time.perf_counter()
        module = load_inline(**load_inline_args(variant, salt))
        elapsed = time.perf_counter() - start
        check_module(module, variant)
        return elapsed
    finally:
        if old is None:
            os.environ.pop("TORCH_EXTENSIONS_DIR", None)
        else:
            os.environ["TORCH_EXTENSIONS_DIR"] = old
        shutil.rmtree(ext_dir, ignore_errors=True)


OBJECT_VARIANTS = {  # name: (slim headers, split nvcc, host prefix precompiled)
    "as_written_plain": (False, False, False), "slim_plain": (True, False, False),
    "slim_split": (True, True, False), "slim_split_host_pch": (True, True, True)}


def _compile_object(slim: bool, split: bool, store: HostPchStore | None, tc) -> tuple[object, dict]:
    """One new candidate's .cu -> .o; its result and, split, its chains' timings."""
    spec = ExtensionSpec.from_load_inline_args(**load_inline_args("cuda", uuid.uuid4().hex[:8]))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "cuda.cu").write_text(cuda_translation_unit(spec.cuda_sources, slim)[0])
        cmd = nvcc_command(spec, tc, spec.checked_flags(), spec.name)
        env = compiler_env(work)
        plan = plan_split(cmd, work, env) if split else None
        if plan is None:
            return run_command("cuda", cmd, cwd=work, env=env, timeout_s=900, label="bench"), {}
        prefix = None
        if store is not None:
            prefix, offered = store.for_build(store.key(tc, plan, work), tc, cmd, "wait", 900)
            if prefix is None:
                raise RuntimeError(f"no host prefix PCH ({offered})")
        run = run_split(plan, cmd, cwd=work, timeout_s=900, label="bench", host_prefix=prefix)
        if store is not None and run.result.ok and run.host_pch != "used":
            raise RuntimeError(f"the host prefix PCH was not used: {run.host_pch}")
        return run.result, run.timings


def host_pch_build(store: HostPchStore, tc) -> dict:
    """The one-time probe and PCH build of the benchmark candidate's host prefix."""
    spec = ExtensionSpec.from_load_inline_args(**load_inline_args("cuda", uuid.uuid4().hex[:8]))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cmd = nvcc_command(spec, tc, spec.checked_flags(), spec.name)
        key = store.key(tc, plan_split(cmd, work, compiler_env(work)), work)
    start = time.perf_counter()
    prefix = store.build(key, tc, cmd, 900)
    wall = time.perf_counter() - start
    if prefix is None:
        raise RuntimeError((store.store.root / key / "pch.log").read_text()[-3000:])
    gch = prefix.header.with_name(prefix.header.name + ".gch")
    steps = re.findall(r"^\[(\w+): exit \d+, ([\d.]+)s wall, ([\d.]+)s cpu\]$",
                       (store.store.root / key / "pch.log").read_text(), re.M)
    return {"wall_s": round(wall, 3), "gch_mb": round(gch.stat().st_size / 1e6, 1),
            "prefix_mb": round(prefix.header.stat().st_size / 1e6, 1),
            "steps": [{"step": name, "wall_s": float(w), "cpu_s": float(c)} for name, w, c in steps]}


def cuda_object(repeats: int, variants: list[str]) -> dict:
    """The .cu -> .o compile alone per variant (as written, i.e. what stock compiles; slim; slim +
    split nvcc; the same with the host prefix precompiled), a new candidate each time, the variants
    interleaved so that a busy spell of the machine hits them alike."""
    tc = detect_toolchain()
    out: dict = {}
    root = Path(tempfile.mkdtemp(prefix="host-pch-bench-"))
    try:
        store = None
        if "slim_split_host_pch" in variants:
            allow_reads(root)
            store = HostPchStore(root / "pch")
            out["host_pch_build"] = host_pch_build(store, tc)
        runs: dict = {v: {"wall": [], "cpu": [], "steps": []} for v in variants}
        for _ in range(repeats):
            for variant in variants:
                slim, split, with_prefix = OBJECT_VARIANTS[variant]
                res, steps = _compile_object(slim, split, store if with_prefix else None, tc)
                if not res.ok:
                    raise RuntimeError(res.output[-3000:])
                runs[variant]["wall"].append(res.wall_s)
                runs[variant]["cpu"].append(res.cpu_s)
                runs[variant]["steps"].append(steps)
        for variant, r in runs.items():
            out[variant] = {"wall": summary(r["wall"]), "cpu": summary(r["cpu"]), "steps": r["steps"]}
            if r["steps"] and r["steps"][0]:
                out[variant]["host_compile_wall"] = summary([s["cuda_host_compile"]["wall_s"] for s in r["steps"]])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def machine() -> dict:
    info = {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "gpu": None, "driver": None}
    tc = detect_toolchain()
    info.update(nvcc=tc.nvcc_version, cxx=tc.cxx_version, arches=list(tc.arches))
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True)
        info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    return info


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each measurement")
    parser.add_argument("--skip-stock", action="store_true", help="do not time stock load_inline")
    parser.add_argument("--cuda-object", action="store_true", help="also time the .cu -> .o compile alone")
    parser.add_argument("--object-variants", default=",".join(OBJECT_VARIANTS),
                        help=f"comma-separated, of {', '.join(OBJECT_VARIANTS)}")
    parser.add_argument("--no-builds", action="store_true", help="skip the load_inline builds (cold, ready, cached)")
    args = parser.parse_args(argv)
    variants = [v for v in args.object_variants.split(",") if v]
    unknown = sorted(set(variants) - set(OBJECT_VARIANTS))
    if unknown:
        parser.error(f"unknown --object-variants {unknown}")

    variant = "cuda" if torch.cuda.is_available() else "cpp"
    report: dict = {"command": " ".join([sys.executable, *sys.argv]) if argv is None else " ".join(argv),
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "machine": machine(), "variant": variant}
    if variant == "cpp":
        report["note"] = ("no CUDA device: timed the C++-only variant of the candidate (same binding, "
                          "a C++ loop instead of the kernel); CUDA numbers need the GPU machine")
    root = Path(tempfile.mkdtemp(prefix="compile-bench-"))
    try:
        if not args.no_builds:
            report["labels"] = {
                "cold_pchs_building": "fresh cache: no precompiled header built yet; the build starts them "
                                      "in the background and compiles without",
                "cold_source_pchs_ready": "both precompiled headers (torch/extension.h, nvcc's host prefix) "
                                          "built, source never built before",
                "cached": "the same source again"}
            cold, cold_steps = [], []
            for i in range(args.repeats):
                t, detail = ours(variant, root / f"cold{i}", uuid.uuid4().hex[:8])
                cold.append(t)
                cold_steps.append(detail)
                wait_for_background_pch()  # the PCHs it started must not slow the next measurement
            ready_dir = root / f"cold{args.repeats - 1}"  # its PCHs are built now
            ready, ready_steps = [], []
            for _ in range(args.repeats):
                t, detail = ours(variant, ready_dir, uuid.uuid4().hex[:8])
                ready.append(t)
                ready_steps.append(detail)
            salt = uuid.uuid4().hex[:8]
            ours(variant, ready_dir, salt)
            cached = [ours(variant, ready_dir, salt)[0] for _ in range(args.repeats)]
            report["cold_pchs_building"] = {**summary(cold), "detail": cold_steps}
            report["cold_source_pchs_ready"] = {**summary(ready), "detail": ready_steps}
            report["cached"] = summary(cached)
            if not args.skip_stock:
                stock_runs = [stock(variant, uuid.uuid4().hex[:8]) for _ in range(args.repeats)]
                report["stock_load_inline"] = summary(stock_runs)
        if args.cuda_object and detect_toolchain().nvcc:
            report["cuda_object"] = cuda_object(args.repeats, variants)
    finally:
        wait_for_background_pch()
        shutil.rmtree(root, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    result = main()
    medians = {k: v.get("median_s") for k, v in result.items() if isinstance(v, dict) and "median_s" in v}
    medians.update({f"cuda_object.{k}": v["wall"]["median_s"] for k, v in result.get("cuda_object", {}).items()
                    if "wall" in v})
    print(json.dumps(medians))
