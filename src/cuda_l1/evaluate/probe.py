"""Which confinement works on this machine: probed once per device by starting a real side.

Some GPU drivers refuse to initialise, or to share memory, inside new namespaces or without Unix
sockets (CUDA's IPC passes descriptors over them); some installations cannot be read by an unprivileged uid. The probe starts a side with a
plan and sees the device work in it (on CUDA, IPC in both directions, as the evaluation needs),
trying weaker plans until one does. The chosen plan is reported in every verdict's `sandbox`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

from cuda_l1.devices import normalize_device
from cuda_l1.evaluate.config import SandboxConfig
from cuda_l1.evaluate.confine import NAMESPACE_SETS, NOBODY, ConfinePlan, readable_by_others
from cuda_l1.evaluate.environment import scrubbed_env
from cuda_l1.evaluate.seccomp import SOCKET_LEVELS


def identity_uid(read_paths: list[str]) -> int | None:
    """The uid a side takes: nobody, when everything it must read is readable by nobody."""
    if os.geteuid() != 0:
        return None
    import cuda_l1

    needed = [sys.prefix, sys.base_prefix, sysconfig.get_path("stdlib"), sysconfig.get_path("purelib"),
              sysconfig.get_path("platlib"), os.path.dirname(os.path.abspath(cuda_l1.__file__))] + read_paths
    return NOBODY if readable_by_others(needed) else None


_PLANS: dict[tuple, str] = {}
_PROBING: dict[tuple, threading.Event] = {}  # probes under way: a second caller waits for the first's
_PLANS_LOCK = threading.Lock()
PROBE_SECONDS: dict[str, float] = {}  # per device: how long this process spent probing (worker start stamps)
PROBE_ENDED: dict[str, float] = {}  # per device: when (time.time()) this process's last probe ended
TRIAL_TIMEOUT_S = 180.0  # one trial: a side's start, a device context, an IPC round trip


def usable_plan(namespaces: bool, device: str, plan: ConfinePlan, server=None) -> tuple[str, str]:
    """(namespaces, sockets): the strongest combination in which a fully confined side still
    initialises this device (probed once per device and plan). Socket families are widened one
    level at a time (seccomp.SOCKET_LEVELS: IP, then IP and Unix, then any) before any namespace is
    given up. `server`: the fork server the sides will come from (fork_server.ForkServer); its
    first stage forks the trials, each then a side as the evaluation forks them, without an
    interpreter and torch import of its own (about 1 s on a 2-core CPU host, 5 s on an H200 host)."""
    if not sys.platform.startswith("linux"):
        return "", plan.sockets
    device = normalize_device(device)  # "cuda" is "cuda:0" here as in the sides that ask for it
    key = (device, plan.uid, plan.landlock, plan.seccomp, plan.drop_identity, namespaces)
    while True:  # one probe per key, whichever thread asks first (probe_ahead's, a side's start)
        with _PLANS_LOCK:
            if key in _PLANS:
                return _PLANS[key]
            under_way = _PROBING.get(key)
            if under_way is None:
                _PROBING[key] = threading.Event()
                break
        under_way.wait()
    try:
        started = time.perf_counter()
        chosen = ("", "any")
        scratch = tempfile.mkdtemp(prefix="cuda-l1-probe-")
        sets = NAMESPACE_SETS[:-1] if namespaces else ("",)
        try:
            if plan.uid is not None:
                os.chown(scratch, plan.uid, plan.uid)
            levels = SOCKET_LEVELS if plan.seccomp else ("any",)
            for which in sets:
                works = _trials(device, [dataclasses.replace(plan, namespaces=which, sockets=sockets)
                                         for sockets in levels], scratch, server)
                if any(works):
                    chosen = (which, levels[works.index(True)])
                    break
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            PROBE_SECONDS[device] = PROBE_SECONDS.get(device, 0.0) + time.perf_counter() - started
            PROBE_ENDED[device] = time.time()
        _PLANS[key] = chosen
        return chosen
    finally:  # a probe that raised leaves the key to the next caller
        with _PLANS_LOCK:
            _PROBING.pop(key).set()


def probe_ahead(config: SandboxConfig, device: str, server=None) -> threading.Thread | None:
    """On CUDA, probe in a thread now for the sides a worker starts first (its spares: no readable
    paths), with the plan SideProcess.start makes for them (SandboxConfig.confine_plan), so that the
    probe (its device contexts; its trials forked from `server`, the fork server, once its first
    stage is ready) runs beside the worker's own imports instead of after them. A side's start then
    finds the plan chosen, or waits for this probe instead of starting another. On a CPU the probe
    is cheap: not done ahead."""
    if not (device.startswith("cuda") and sys.platform.startswith("linux")):
        return None
    plan = config.confine_plan("", identity_uid([]) if config.drop_identity else None)
    thread = threading.Thread(target=usable_plan, args=(config.namespaces, device, plan, server),
                              name="cuda-l1-probe-ahead", daemon=True)
    thread.start()
    return thread


def _trials(device: str, plans: list[ConfinePlan], scratch: str, server=None) -> list[bool]:
    """Whether each plan works. On CUDA all of them at once (a trial creates a device context, and
    the socket levels of one namespace set usually need two of them); on a CPU one at a time,
    strongest first, stopping at the first that works (a small host has few cores to spare)."""
    def run(i: int, trial: ConfinePlan) -> bool:
        own = tempfile.mkdtemp(prefix=f"trial{i}-", dir=scratch)
        if trial.uid is not None:
            os.chown(own, trial.uid, trial.uid)
        try:
            return _probe(device, dataclasses.replace(trial, scratch=own), own, server)
        except Exception:  # noqa: BLE001 - a trial that cannot even start is a plan that does not work
            return False

    if not device.startswith("cuda") or len(plans) == 1:
        works = []
        for i, trial in enumerate(plans):
            works.append(run(i, trial))
            if works[-1]:
                break
        return works + [False] * (len(plans) - len(works))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(plans), thread_name_prefix="cuda-l1-probe") as pool:
        return list(pool.map(run, range(len(plans)), plans))


def _probe(device: str, plan: ConfinePlan, scratch: str, server=None) -> bool:
    """Start a side under `plan` and see the device work in it (on CUDA: IPC both ways, as the
    evaluation needs): forked from `server`'s first stage, else (none, or it is gone) a fresh
    interpreter."""
    if not device.startswith("cuda"):
        return _trial(device, plan, scratch, server, None, lambda talk: True)
    import torch

    from cuda_l1.evaluate import cudadrv

    ptr = cudadrv.alloc(device, 4096)
    mine = cudadrv.tensor_at(device, ptr, 4096)
    mine.copy_(torch.arange(4096, device=device).remainder(251).to(torch.uint8))
    torch.cuda.synchronize(device)

    def both_ways(talk) -> bool:
        line = talk.readline()
        reply = json.loads(line) if line.strip().startswith("{") else {}
        if "handle" not in reply:
            return False
        base = cudadrv.open_handle(device, reply["handle"])
        same = bool(torch.equal(cudadrv.tensor_at(device, base, 4096), mine))
        cudadrv.close_handle(base)
        return same

    try:
        return _trial(device, plan, scratch, server, cudadrv.export_base(ptr), both_ways)
    except (cudadrv.CudaDriverError, ValueError):
        return False
    finally:
        cudadrv.free(ptr)


class _Talk:
    """The parent's ends of a trial's stdin and stdout, as text."""

    def __init__(self, to_trial: int, from_trial: int):
        self.writer = os.fdopen(to_trial, "w")
        self.reader = os.fdopen(from_trial, "r")

    def readline(self, timeout: float = TRIAL_TIMEOUT_S) -> str:
        """The trial's first line, or "" when it says nothing within `timeout` (a device that hangs
        while it starts: that plan does not work)."""
        ready, _, _ = select.select([self.reader], [], [], timeout)
        return self.reader.readline() if ready else ""

    def close(self) -> None:
        for end in (self.writer, self.reader):
            try:
                end.close()
            except OSError:
                pass


def _trial(device: str, plan: ConfinePlan, scratch: str, server, handle: str | None, check) -> bool:
    """Run one trial (`handle`: the parent's CUDA IPC handle for it to open, None on a CPU): True when
    `check(talk)` holds of what it said and it then exited 0 (a CPU trial says nothing: its exit
    status is the answer). Its stdin is closed once checked, which ends a CUDA trial."""
    plan_json = json.dumps(dataclasses.asdict(plan))
    cmd = [sys.executable, "-m", "cuda_l1.evaluate.child", "--probe", "--read-fd", "0", "--write-fd", "1",
           "--device", device, "--plan", plan_json]
    if handle is not None:
        cmd += ["--probe-handle", handle]
    trial_in, to_trial = os.pipe()
    from_trial, trial_out = os.pipe()
    proc = None
    with open(os.devnull, "wb") as devnull:
        try:
            if server is not None:  # None back: a fresh interpreter, slower, the same trial
                proc = server.spawn_trial(device, plan_json, trial_in, trial_out, devnull.fileno(), scratch,
                                          scrubbed_env(scratch), handle)
            if proc is None:
                proc = subprocess.Popen(cmd, env=scrubbed_env(scratch), cwd=scratch, stdin=trial_in, stdout=trial_out,
                                        stderr=devnull, start_new_session=True, close_fds=True)
        except BaseException:
            for fd in (to_trial, from_trial):
                os.close(fd)
            raise
        finally:
            os.close(trial_in)
            os.close(trial_out)
    talk = _Talk(to_trial, from_trial)
    try:
        works = bool(check(talk))
        talk.close()
        return proc.wait(timeout=TRIAL_TIMEOUT_S) == 0 and works
    except (subprocess.TimeoutExpired, OSError, ValueError):
        _kill(proc)
        return False
    finally:
        talk.close()
        _kill(proc)
        if hasattr(proc, "release"):
            proc.release()


def _kill(proc) -> None:
    """End a trial that has not exited (a forked one's pid stays its server's until released)."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            proc.wait(timeout=10)
