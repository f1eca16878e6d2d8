"""`--device` (or a config's `device`), parsed once where it enters into a Device the layers below carry.

Spelling: `cpu`; `cuda` (every visible GPU: one worker each); `cuda:N` (that GPU); `auto` or nothing
(cuda when this host sees a GPU or a Ray cluster evaluates, else cpu). With a Ray cluster the GPUs are
the cluster's, so a driver without one may still ask for cuda. No torch at import: `--help` stays fast.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from cuda_l1.errors import UserError
from cuda_l1.settings import setting

SPELLING = "cpu, cuda, cuda:N or auto"


@dataclass(frozen=True)
class Device:
    """Where candidates are evaluated."""

    kind: str = setting(help="cpu or cuda")
    index: int | None = setting(None, "the GPU of cuda:N; None: every visible GPU")
    remote: bool = setting(False, "the GPUs are a Ray cluster's, not this host's (nothing is run here)")

    def __str__(self) -> str:
        if self.kind == "cpu":
            return "cpu"
        return "cuda" if self.index is None else f"cuda:{self.index}"

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def local_gpu(self) -> bool:
        """A GPU of this host: what references are checked on and calibration times."""
        return self.is_cuda and not self.remote


def is_spelled(text: str) -> bool:
    """Whether `text` is one device as the layers below carry it: cpu, cuda or cuda:N."""
    return text in ("cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit())


def names_gpus(text: str | None, cluster: str = "local") -> bool:
    """Whether a device setting (one device or a list) means GPUs, read from its spelling only: no
    visibility check, for a process that need not see the GPUs the evaluation uses."""
    first = (text if text is not None else "auto").split(",")[0].strip() or "cpu"
    if first == "auto":
        return cluster != "local" or local_gpu_count() > 0
    return first.startswith("cuda")


def local_gpu_count() -> int:
    """GPUs this process may use on this host (CUDA_VISIBLE_DEVICES honoured; 0 without CUDA). Asked of
    the CUDA driver through ctypes while torch is not imported: parsing --device and starting a pool's
    workers waited for an import of torch (5 s on an H200 host) that nothing else there needed. Through
    torch where it is imported already, or where the driver answers with an error."""
    if "torch" not in sys.modules:
        count = _driver_gpu_count()
        if count is not None:
            return count
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


_CUDA_ERROR_NO_DEVICE = 100


def _driver_gpu_count() -> int | None:
    """cuInit, then cuDeviceGetCount: 0 where no driver library is installed or it sees no device,
    None where it fails otherwise or a ROCm runtime is installed (torch then decides)."""
    import ctypes
    import ctypes.util

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        code = lib.cuInit(0)
        if code == _CUDA_ERROR_NO_DEVICE:
            return 0
        count = ctypes.c_int(0)
        if code != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return None
    except OSError:  # no CUDA driver library: no GPU, unless torch is a ROCm build (HIP's runtime)
        return None if ctypes.util.find_library("amdhip64") else 0
    except AttributeError:  # a library without the driver API's names
        return None
    return count.value


def check_cluster(cluster: str) -> None:
    """`--cluster` is local, ray or ray://ADDRESS: checked with the device, before any work, since a run
    that needs no pool (all of it resumed) would otherwise take a misspelling without a word."""
    if cluster not in ("local", "ray") and not (cluster.startswith("ray://") and len(cluster) > len("ray://")):
        raise UserError(f"--cluster is local, ray or ray://ADDRESS (got {cluster!r}).")


def parse_device(text: str | None, cluster: str = "local", what: str = "--device") -> Device:
    """The Device `text` names, checked against what this host (or the cluster) can run."""
    check_cluster(cluster)
    remote = cluster != "local"
    if text is None:  # nothing asked for: what this host has (a cluster's GPUs only when asked: auto or cuda)
        return Device("cuda") if local_gpu_count() else Device("cpu")
    spelled = text.strip()
    if spelled == "auto":
        return Device("cuda", remote=remote) if remote or local_gpu_count() else Device("cpu")
    if spelled == "cpu":
        return Device("cpu")
    if spelled == "cuda":
        device = Device("cuda", remote=remote)
    elif is_spelled(spelled):
        device = Device("cuda", int(spelled[5:]), remote=remote)
    else:
        raise UserError(f"{what} is {SPELLING} (got {text!r}).")
    if not remote:
        count = local_gpu_count()
        if not count:
            raise UserError(f"{what} {spelled} was asked for, but no CUDA device is visible; use {what} cpu.")
        if device.index is not None and device.index >= count:
            raise UserError(f"{what} {spelled} was asked for, but this host sees {count} GPU(s) (cuda:0 to "
                            f"cuda:{count - 1}).")
    return device


def parse_devices(text: str | None, cluster: str = "local", what: str = "--device") -> list[Device]:
    """A comma-separated list of devices, each parsed as above: one pool each (e.g. the GPUs training
    leaves free). An empty list means cpu; a list of several needs the local cluster."""
    parts = [p.strip() for p in (text if text is not None else "auto").split(",") if p.strip()]
    devices = [parse_device(p, cluster, what) for p in parts] or [Device("cpu")]
    if len(devices) > 1 and cluster != "local":
        raise UserError(f"{what}: a list of devices needs the local cluster; a Ray cluster places workers itself "
                        f"(got {text!r}).")
    return devices


def as_device(value: Device | str | None, cluster: str = "local", what: str = "--device") -> Device:
    """A Device as is; a spelling (from the Python API) parsed. Entry points call this once."""
    return value if isinstance(value, Device) else parse_device(value, cluster, what)


def normalize_device(device: str) -> str:
    """One spelling per device: "cuda" is "cuda:0" (a probe or a plan filed under "cuda" would not be
    found by the sides, which ask for "cuda:0")."""
    return "cuda:0" if device == "cuda" else device


def device_key(device: Device) -> str:
    """How verdicts are filed in the store: by the device's name, so runs on one GPU type resume."""
    from cuda_l1.evaluate.device import device_name

    if device.remote and device.is_cuda:
        return "cuda (remote cluster)"  # the driver has no GPU to name; the workers' GPUs judge
    return device_name(normalize_device(str(device)))
