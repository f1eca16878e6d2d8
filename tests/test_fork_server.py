"""Sides forked by the fork server (fork_server.py): they start in a fraction of a fresh side's time,
hold only their own descriptors and the scrubbed environment, report how they ended, leave no
process behind, and the evaluator falls back to a fresh interpreter when the server is unusable.
(The adversarial corpus runs against forked sides in test_adversarial.py.)"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cuda_l1.evaluate import fork_server
from cuda_l1.evaluate.config import SandboxConfig
from cuda_l1.evaluate.sandbox import SideProcess
from task_sources import one_line_task, untimed_cpu_config

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="forks and reads /proc (Linux)")


def _ready(side: SideProcess, limit_s: float = 120.0) -> float:
    started = time.perf_counter()
    while not side.started():
        assert time.perf_counter() - started < limit_s, side.log_tail()
        assert side.exit_info().reason == "running", side.log_tail()
        time.sleep(0.005)
    return time.perf_counter() - started


def _children(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(p) for p in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            pass
    return out


def test_a_forked_side_is_ready_fast_and_holds_only_what_a_side_should(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-fork-secret")
    server = fork_server.shared()
    assert server.usable(), server.log_tail()
    config = SandboxConfig(fork_server=True)
    side = SideProcess.start(config, "cpu", [], None)
    try:
        assert isinstance(side.proc, fork_server.ForkedProcess)
        assert _ready(side) < 30
        harness = side.harness_pid()
        # /proc/PID/environ shows the block the server was started with (scrubbed too); the side's
        # own variables are set over it after the fork.
        environ = Path(f"/proc/{harness}/environ").read_bytes().split(b"\0")
        assert not any(b"sk-test-" in entry for entry in environ)
        assert os.readlink(f"/proc/{harness}/cwd").startswith(side.scratch) or "scratch tmpfs" in str(side.notes)
        # Its descriptors: standard streams, its two pipes, and what its own confinement opened;
        # never the server's socket.
        links = [os.readlink(f"/proc/{harness}/fd/{fd}") for fd in os.listdir(f"/proc/{harness}/fd")]
        assert not any(link.startswith("socket:") for link in links), links
        assert len(links) <= 8, links
    finally:
        side.close(graceful=True)
    assert side.exit_info().reason == "exited"


def test_a_forked_side_that_is_killed_says_so_and_is_reaped():
    server = fork_server.shared()
    assert server.usable()
    side = SideProcess.start(SandboxConfig(fork_server=True), "cpu", [], None)
    _ready(side)
    with pytest.raises(subprocess.TimeoutExpired):  # running: no status yet
        side.proc.wait(timeout=0.05)
    assert side.proc.poll() is None
    pid = side.proc.pid
    side.kill("test")
    assert side.proc.wait(timeout=10) == -9
    assert side.exit_info().signal == 9
    side.close(graceful=False)
    stages = [server._proc.pid] + ([server.compilers.pid] if server.compilers and server.compilers.pid else [])
    deadline = time.monotonic() + 10
    while any(pid in _children(stage) for stage in stages) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid in _children(stage) for stage in stages)  # released, then reaped by its stage


def test_many_forked_sides_start_faster_than_fresh_ones():
    assert fork_server.shared().usable()
    times = {}
    for fork in (True, False):
        sides = [SideProcess.start(SandboxConfig(fork_server=fork), "cpu", [], None) for _ in range(3)]
        try:
            times[fork] = max(_ready(side) for side in sides)
        finally:
            for side in sides:
                side.close(graceful=False)
    assert times[True] < times[False], times


def test_without_a_usable_server_a_side_starts_as_a_fresh_interpreter(monkeypatch):
    class Gone:
        def spawn(self, *args, **kwargs):
            raise fork_server.NotSent("the fork server exited")

    monkeypatch.setattr(fork_server, "shared", lambda preload=True: Gone())
    side = SideProcess.start(SandboxConfig(fork_server=True), "cpu", [], None)
    try:
        assert isinstance(side.proc, subprocess.Popen)
        _ready(side)
    finally:
        side.close(graceful=False)


def test_a_request_the_server_took_and_never_answered_is_not_started_again(monkeypatch):
    """Its descriptors were handed over: a late fork could share them with a fresh interpreter."""
    class Silent:
        def spawn(self, *args, **kwargs):
            raise OSError("the fork server did not answer a request within 30 s")

    monkeypatch.setattr(fork_server, "shared", lambda preload=True: Silent())
    with pytest.raises(OSError, match="did not answer"):
        SideProcess.start(SandboxConfig(fork_server=True), "cpu", [], None)


def test_a_server_that_stops_answering_is_ended_and_replaced(monkeypatch):
    server = fork_server.ForkServer(preload=())  # one stage: the one stopped below answers every request
    try:
        assert server.usable()
        monkeypatch.setattr(fork_server, "SPAWN_TIMEOUT_S", 0.5)
        os.kill(server._proc.pid, 19)  # SIGSTOP: it takes the request and never answers
        r, w = os.pipe()
        try:
            with pytest.raises(OSError, match="did not answer"):
                server.spawn("cpu", "{}", r, w, -1, w, "/", {})
        finally:
            os.close(r)
            os.close(w)
        assert server._dead and not server.usable()
        server._proc.wait(timeout=10)  # ended, not left to fork later
    finally:
        server.close()


TASK = one_line_task("x * 2.0")

# What a fresh interpreter in its own directory has, a forked side must have too: temp files go to
# its TMPDIR (its scratch), and its directory, not the server's, leads the import path.
LIKE_A_FRESH_SIDE = """
import os, sys, tempfile


class ModelNew(Model):
    def __init__(self):
        super().__init__()
        fd, path = tempfile.mkstemp()
        os.close(fd)
        assert os.path.dirname(path) == os.environ["TMPDIR"], (path, os.environ["TMPDIR"])
        assert os.path.realpath(sys.path[0]) == os.path.realpath(os.getcwd()), (sys.path[0], os.getcwd())
        assert not any("fork-server" in p for p in sys.path), sys.path
"""


@pytest.mark.parametrize("fork", [True, False])
def test_a_side_has_its_own_temp_directory_and_import_path(fork):
    from cuda_l1.evaluate.evaluator import Evaluator
    from cuda_l1.tasks import make_task

    evaluator = Evaluator(make_task(TASK, name="1_double", level=1, origin="test:double"), untimed_cpu_config(fork))
    try:
        verdict = evaluator.evaluate(TASK + LIKE_A_FRESH_SIDE)
        assert verdict.status == "ok", (verdict.reasons, verdict.log[-2000:])
        assert verdict.sandbox["started"] == ("forked" if fork else "fresh interpreter")
    finally:
        evaluator.close()


SLOW_PRELOAD = "import time\ntime.sleep(4)\n"


def test_sides_asked_for_before_the_compilers_stage_is_ready_come_from_the_first(tmp_path, monkeypatch):
    """The first stage forks once torch is imported; the compilers' stage, forked from it, takes over
    once its preload is in. A side's server says which stage it came from, and so what it has."""
    monkeypatch.setattr(fork_server, "_preload_refused", "")
    (tmp_path / "slow_preload.py").write_text(SLOW_PRELOAD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path)] + os.sys.path))
    server = fork_server.ForkServer(preload=("slow_preload",))
    sides = []
    try:
        assert server.usable(), server.log_tail()
        assert server.preloaded == () and not server.compilers.is_ready()  # still importing
        for _ in range(2):
            r, w = os.pipe()
            try:
                sides.append(server.spawn("cpu", "{}", r, w, -1, w, str(tmp_path), {}))
            finally:
                os.close(r)
                os.close(w)
            if len(sides) == 1:
                assert server.wait_compilers(), server.log_tail()
                assert server.preloaded == ("slow_preload",)
        assert [side.server for side in sides] == [server.first, server.compilers]
        assert server.compilers.pid in _children(server._proc.pid)  # forked from the first stage
        assert server.first.ready_at < server.compilers.ready_at
        for side in sides:  # an invalid plan: each exits at once, reported by its own stage
            assert side.wait(timeout=30) != 0
            side.release()
    finally:
        server.close()
    assert server._proc.poll() is not None


def test_a_server_closed_before_its_compilers_stage_is_ready_refuses_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(fork_server, "_preload_refused", "")
    (tmp_path / "slow_preload.py").write_text(SLOW_PRELOAD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path)] + os.sys.path))
    server = fork_server.ForkServer(preload=("slow_preload",))
    assert server.usable(), server.log_tail()
    server.close()
    time.sleep(0.5)
    assert fork_server._preload_refused == ""


@contextlib.contextmanager
def _probe_scratch(plan):
    """A directory as probe.usable_plan makes one: where the side's uid (nobody, when it takes one)
    can reach it, which a test's own temporary directory is not."""
    scratch = tempfile.mkdtemp(prefix="cuda-l1-probe-test-")
    if plan.uid is not None:
        os.chown(scratch, plan.uid, plan.uid)
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_the_confinement_probe_forks_its_trials_from_the_first_stage():
    """A trial is a side forked as the evaluation forks them (no interpreter or torch import of its
    own); a plan that cannot work fails forked as it fails in a fresh interpreter."""
    import dataclasses

    from cuda_l1.evaluate import probe

    server = fork_server.shared()
    assert server.usable(), server.log_tail()
    config = SandboxConfig()
    plan = config.confine_plan("", probe.identity_uid([]) if config.drop_identity else None)
    broken = dataclasses.replace(plan, limits=dict(plan.limits, open_files=3))  # not even its own pipes
    results, seconds = {}, {}
    for name, where in (("forked", server), ("fresh", None)):
        for label, trial in (("works", plan), ("broken", broken)):
            with _probe_scratch(plan) as scratch:
                started = time.perf_counter()
                results[name, label] = probe._trials("cpu", [trial], scratch, where)
                seconds[name, label] = time.perf_counter() - started
    assert results == {("forked", "works"): [True], ("forked", "broken"): [False],
                       ("fresh", "works"): [True], ("fresh", "broken"): [False]}
    assert seconds["forked", "works"] < seconds["fresh", "works"], seconds


def test_nothing_is_timed_while_a_second_stage_still_imports(tmp_path, monkeypatch):
    """Its import is a busy process beside the timed core: the first timing of a process waits for
    it (TaskEnv.calibrate_quiet). On the 2-core host, timing during it read a 1.7x candidate at 0.88."""
    monkeypatch.setattr(fork_server, "_preload_refused", "")
    (tmp_path / "slow_preload.py").write_text(SLOW_PRELOAD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path)] + os.sys.path))
    server = fork_server.ForkServer(preload=("slow_preload",))
    monkeypatch.setattr(fork_server, "_SHARED", {True: server})
    try:
        assert server.usable() and not server.compilers.is_ready()
        fork_server.wait_for_imports()
        assert server.compilers.is_ready()
        started = time.perf_counter()
        fork_server.wait_for_imports()  # nothing left to wait for
        assert time.perf_counter() - started < 0.05
    finally:
        server.close()


def test_a_gpu_hosts_pinned_timing_does_not_wait_for_the_second_stage(tmp_path, monkeypatch):
    """With both sides pinned to one core of a host with idle cores to spare, the import runs elsewhere:
    the first timing goes ahead. With few cores, or unpinned, it still waits."""
    monkeypatch.setattr(fork_server, "_preload_refused", "")
    (tmp_path / "slow_preload.py").write_text(SLOW_PRELOAD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path)] + os.sys.path))
    server = fork_server.ForkServer(preload=("slow_preload",))
    monkeypatch.setattr(fork_server, "_SHARED", {True: server})
    try:
        assert server.usable() and not server.compilers.is_ready()
        monkeypatch.setattr(fork_server.os, "sched_getaffinity", lambda pid: set(range(16)))
        fork_server.wait_for_imports(pinned_core=3)
        assert not server.compilers.is_ready()  # went ahead beside the import
        assert any(t.name == "cuda-l1-compilers-wait" for t in threading.enumerate())  # a hung one still ends
        monkeypatch.setattr(fork_server.os, "sched_getaffinity", lambda pid: {0, 1})
        fork_server.wait_for_imports(pinned_core=1)
        assert server.compilers.is_ready()
    finally:
        server.close()


@pytest.mark.gpu
def test_on_a_gpu_forked_and_fresh_trials_agree_at_every_socket_level():
    """On CUDA a trial creates a device context and passes IPC memory both ways. Forked from the first
    stage it must find what a fresh interpreter finds at each socket level of the strongest
    namespaces, or the probe would weaken the sandbox for a reason of its own (the plan chosen is
    in every verdict's `sandbox`)."""
    import dataclasses

    from cuda_l1.evaluate import probe
    from cuda_l1.evaluate.confine import NAMESPACE_SETS
    from cuda_l1.evaluate.seccomp import SOCKET_LEVELS

    server = fork_server.shared()
    assert server.usable(), server.log_tail()
    config = SandboxConfig()
    plan = config.confine_plan("", probe.identity_uid([]) if config.drop_identity else None)
    results = {}
    for which in NAMESPACE_SETS[:1]:
        trials = [dataclasses.replace(plan, namespaces=which, sockets=sockets) for sockets in SOCKET_LEVELS]
        for name, where in (("forked", server), ("fresh", None)):
            with _probe_scratch(plan) as scratch:
                results[name, which] = probe._trials("cuda:0", trials, scratch, where)
    assert results[("forked", NAMESPACE_SETS[0])] == results[("fresh", NAMESPACE_SETS[0])], results
    assert any(results[("forked", NAMESPACE_SETS[0])]), results  # the strongest namespaces work at some level
