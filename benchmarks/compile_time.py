"""How long one `load_inline`-style extension takes to build: this project's build layer vs stock.

Measures, for a representative candidate (one CUDA elementwise kernel plus one bound function,
the CUDA source including <torch/extension.h> as candidates write it):
  cold            fresh cache directory, precompiled header not built yet (default config)
  warm_toolchain  precompiled header built, source never built before
  cached          the same source again
  stock           torch.utils.cpp_extension.load_inline in a fresh TORCH_EXTENSIONS_DIR
Without a GPU (no CUDA torch to link against) it measures the C++-only variant of the candidate
and says so in the JSON; `--cuda-object` adds the `.cu` -> object compile alone, which works
wherever nvcc is installed (as written vs slim headers, plain vs split nvcc).

    python benchmarks/compile_time.py --out benchmarks/results/compile_time_h200.json --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
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
from cuda_l1.evaluate.build.nvcc_split import plan_split, run_split
from cuda_l1.evaluate.build.procs import compiler_env, run_command
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


def cuda_object(repeats: int) -> dict:
    """The .cu -> .o compile alone: as written (what stock compiles), slim, slim + split nvcc."""
    tc = detect_toolchain()
    out: dict = {}
    for label, slim, split in (("as_written_plain", False, False), ("slim_plain", True, False),
                               ("slim_split", True, True)):
        walls, cpus = [], []
        for _ in range(repeats):
            spec = ExtensionSpec.from_load_inline_args(**load_inline_args("cuda", uuid.uuid4().hex[:8]))
            with tempfile.TemporaryDirectory() as tmp:
                work = Path(tmp)
                (work / "cuda.cu").write_text(cuda_translation_unit(spec.cuda_sources, slim)[0])
                cmd = nvcc_command(spec, tc, spec.checked_flags(), spec.name)
                env = compiler_env(work)
                plan = plan_split(cmd, work, env) if split else None
                if plan is not None:
                    res = run_split(plan, cmd, cwd=work, timeout_s=900, label="bench").result
                else:
                    res = run_command("cuda", cmd, cwd=work, env=env, timeout_s=900, label="bench")
                if not res.ok:
                    raise RuntimeError(res.output[-3000:])
                walls.append(res.wall_s)
                cpus.append(res.cpu_s)
        out[label] = {"wall": summary(walls), "cpu": summary(cpus)}
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
    args = parser.parse_args(argv)

    variant = "cuda" if torch.cuda.is_available() else "cpp"
    report: dict = {"command": " ".join([sys.executable, *sys.argv]) if argv is None else " ".join(argv),
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "machine": machine(), "variant": variant}
    if variant == "cpp":
        report["note"] = ("no CUDA device: timed the C++-only variant of the candidate (same binding, "
                          "a C++ loop instead of the kernel); CUDA numbers need the GPU machine")
    root = Path(tempfile.mkdtemp(prefix="compile-bench-"))
    try:
        cold, cold_steps = [], []
        for i in range(args.repeats):
            t, detail = ours(variant, root / f"cold{i}", uuid.uuid4().hex[:8])
            cold.append(t)
            cold_steps.append(detail)
            wait_for_background_pch()  # the PCH it started must not slow the next measurement
        warm_dir = root / f"cold{args.repeats - 1}"  # its PCH is built now
        warm, warm_steps = [], []
        for _ in range(args.repeats):
            t, detail = ours(variant, warm_dir, uuid.uuid4().hex[:8])
            warm.append(t)
            warm_steps.append(detail)
        salt = uuid.uuid4().hex[:8]
        ours(variant, warm_dir, salt)
        cached = [ours(variant, warm_dir, salt)[0] for _ in range(args.repeats)]
        report["cold"] = {**summary(cold), "detail": cold_steps}
        report["warm_toolchain"] = {**summary(warm), "detail": warm_steps}
        report["cached"] = summary(cached)
        if not args.skip_stock:
            stock_runs = [stock(variant, uuid.uuid4().hex[:8]) for _ in range(args.repeats)]
            report["stock_load_inline"] = summary(stock_runs)
        if args.cuda_object and detect_toolchain().nvcc:
            report["cuda_object"] = cuda_object(args.repeats)
    finally:
        wait_for_background_pch()
        shutil.rmtree(root, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    result = main()
    print(json.dumps({k: v.get("median_s") for k, v in result.items() if isinstance(v, dict) and "median_s" in v}))
