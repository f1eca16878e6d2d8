"""The device under test: its name, the software versions that make a measurement comparable, GPU
telemetry (clocks, temperature, throttle reasons) read through NVML without changing any setting,
and a health check after a candidate faulted."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess

import torch

import cuda_l1


@functools.lru_cache(maxsize=None)
def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    # No thread count here: it is an evaluation setting (in the verdict's timing), and the name is how
    # stored verdicts are found again.
    return f"cpu ({platform.processor() or platform.machine()})"


@functools.lru_cache(maxsize=None)
def driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def versions(device: str) -> dict[str, str]:
    info = {
        "cuda_l1": cuda_l1.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if device.startswith("cuda"):
        info["cuda"] = str(torch.version.cuda)
        info["cudnn"] = str(torch.backends.cudnn.version())
        info["driver"] = str(driver_version())
        triton = _dist_version("triton")
        if triton:
            info["triton"] = triton
        cap = torch.cuda.get_device_capability(torch.device(device))
        info["capability"] = f"{cap[0]}.{cap[1]}"
    return info


def versions_key(device: str) -> str:
    """Everything that invalidates a stored reference timing when it changes."""
    v = versions(device)
    return "|".join(f"{k}={v[k]}" for k in sorted(v)) + f"|device={device_name(device)}"


class Telemetry:
    """NVML readings around a measurement window. Read-only: never changes clocks or limits."""

    def __init__(self, device: str):
        self.handle = None
        if not device.startswith("cuda"):
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = torch.device(device).index or 0
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.nvml = pynvml
        except Exception:  # NVML missing or not permitted: telemetry is optional
            self.handle = None

    def read(self) -> dict:
        if self.handle is None:
            return {}
        n = self.nvml
        out = {}
        try:
            out["sm_clock_mhz"] = n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM)
            out["mem_clock_mhz"] = n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_MEM)
            out["temperature_c"] = n.nvmlDeviceGetTemperature(self.handle, n.NVML_TEMPERATURE_GPU)
            out["power_w"] = n.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
            reasons = n.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle)
            out["throttle_reasons"] = int(reasons)
            # Idle and application-clock settings are not throttling; thermal/power/sync boost are.
            benign = getattr(n, "nvmlClocksThrottleReasonGpuIdle", 1) | getattr(
                n, "nvmlClocksThrottleReasonApplicationsClocksSetting", 2)
            out["throttled"] = bool(reasons & ~benign)
        except Exception as exc:  # a reading that fails is reported, not fatal
            out["error"] = str(exc)
        return out


def gpu_healthy(device: str) -> tuple[bool, str]:
    """After a candidate faulted, check that this process can still use the GPU correctly."""
    if not device.startswith("cuda"):
        return True, "cpu"
    try:
        x = torch.arange(1 << 20, device=device, dtype=torch.float32)
        total = x.sum().item()
        torch.cuda.synchronize(device)
        expected = float((1 << 20) * ((1 << 20) - 1) / 2)
        ok = abs(total - expected) / expected < 1e-3
        return ok, "ok" if ok else f"wrong result {total} != {expected}"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
