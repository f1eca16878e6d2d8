"""`--device` is parsed once, at the edge, into a Device (spelling, visibility, a cluster's GPUs)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cuda_l1 import devices
from cuda_l1.devices import Device, as_device, parse_device, parse_devices
from cuda_l1.errors import UserError


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this host sees `n` GPUs."""
    def set_count(n: int) -> None:
        monkeypatch.setattr(devices, "local_gpu_count", lambda: n)
    return set_count


def test_spellings_on_a_host_with_two_gpus(gpus):
    gpus(2)
    assert parse_device("cpu") == Device("cpu")
    assert parse_device("cuda") == Device("cuda") and str(parse_device("cuda")) == "cuda"
    assert parse_device("cuda:1") == Device("cuda", 1) and str(Device("cuda", 1)) == "cuda:1"
    assert parse_device(None) == parse_device("auto") == Device("cuda")
    assert parse_device(" cuda:0 ") == Device("cuda", 0)
    with pytest.raises(UserError, match="sees 2 GPU"):
        parse_device("cuda:2")


@pytest.mark.parametrize("text", ["GPU0", "cuda:", "cuda:x", "cuda1", "CUDA", "cpu:0", ""])
def test_misspellings_are_refused_with_the_rule(gpus, text):
    gpus(1)
    with pytest.raises(UserError, match="cpu, cuda, cuda:N or auto"):
        parse_device(text)


def test_without_a_gpu_auto_is_cpu_and_cuda_is_refused(gpus):
    gpus(0)
    assert parse_device("auto") == Device("cpu")
    with pytest.raises(UserError, match="no CUDA device is visible; use --device cpu"):
        parse_device("cuda")
    with pytest.raises(UserError, match=r"\[eval\] device cuda:0"):
        parse_device("cuda:0", what="[eval] device")


def test_a_clusters_gpus_need_none_here(gpus):
    gpus(0)
    device = parse_device("cuda", cluster="ray")
    assert device == Device("cuda", remote=True) and device.is_cuda and not device.local_gpu
    assert parse_device("auto", cluster="ray://head:10001").remote
    assert parse_device(None, cluster="ray") == Device("cpu")  # nothing asked: what this host has
    assert parse_device("cpu", cluster="ray") == Device("cpu")


def test_device_lists_name_local_gpus(gpus):
    gpus(8)
    assert parse_devices("cuda:6, cuda:7") == [Device("cuda", 6), Device("cuda", 7)]
    assert parse_devices("auto") == [Device("cuda")]
    assert parse_devices("") == parse_devices(",") == [Device("cpu")]
    assert parse_devices("cpu,cpu") == [Device("cpu"), Device("cpu")]
    with pytest.raises(UserError, match="needs the local cluster"):
        parse_devices("cuda:1,cuda:2", cluster="ray")


def test_as_device_passes_a_device_through_and_parses_a_spelling(gpus):
    gpus(0)
    remote = Device("cuda", remote=True)
    assert as_device(remote) is remote
    assert as_device("cpu") == Device("cpu")
    with pytest.raises(UserError):
        as_device("cuda")


def test_spelling_rules_shared_by_the_config_check_and_the_training_ranks(gpus):
    from cuda_l1.devices import is_spelled, names_gpus

    assert [is_spelled(t) for t in ("cpu", "cuda", "cuda:3", "cuda:", "gpu", "auto")] == [True] * 3 + [False] * 3
    gpus(0)
    assert names_gpus("cuda:6,cuda:7") and not names_gpus("cpu") and not names_gpus("")
    assert not names_gpus("auto") and names_gpus("auto", cluster="ray")
    gpus(1)
    assert names_gpus("auto")


def test_gpus_are_counted_without_importing_torch_and_as_torch_counts_them():
    """Parsing --device and starting a pool counted GPUs through torch, and every worker's start waited
    for that import (5 s on an H200 host). The driver is asked instead; the count is torch's."""
    probe = ("import sys; from cuda_l1.devices import local_gpu_count; n = local_gpu_count(); "
             "print(n, 'torch' in sys.modules); import torch; "
             "print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ours, after = out.stdout.split("\n")[:2]
    count, imported = ours.split()
    assert imported == "False" and int(count) == int(after)


def test_workers_beyond_the_hosts_gpus_or_cores_are_cut_with_a_note(gpus, monkeypatch, capsys):
    """--workers 64 on a 2-core host started 64 CPU workers, each timing on a shared core."""
    from cuda_l1.evaluate import worker_slots

    monkeypatch.setattr(worker_slots, "usable_cores", lambda: 2)
    gpus(0)
    assert worker_slots.worker_devices("cpu", None) == ["cpu"]
    assert worker_slots.worker_devices("cpu", 2) == ["cpu", "cpu"] and not capsys.readouterr().err
    assert worker_slots.worker_devices("cpu", 64) == ["cpu", "cpu"]
    assert "--workers 64 is more than 2 usable core(s)" in capsys.readouterr().err
    gpus(2)
    assert worker_slots.worker_devices("cuda", None) == ["cuda:0", "cuda:1"]
    assert worker_slots.worker_devices("cuda", 3) == ["cuda:0", "cuda:1"]
    assert "--workers 3 is more than 2 visible GPU(s)" in capsys.readouterr().err
    assert worker_slots.worker_devices("cuda:1", 2) == ["cuda:1"]
    assert "starting 1" in capsys.readouterr().err
