"""A GPU reference side's float64 oracle that falls back to the CPU runs on the parent's cores, not on the
one core the side is pinned to for its windows, and the side is pinned again before anything else runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from cuda_l1.evaluate import output_checks, pinning, protocol, validate
from cuda_l1.evaluate.config import EvalConfig
from cuda_l1.evaluate.oracle_run import on_threads
from cuda_l1.evaluate.protocol import CallToVerify, Oracle, Verified, Verify
from cuda_l1.evaluate.validate import ProtocolError
from cuda_l1.evaluate.sandbox import ChildFailure
from cuda_l1.evaluate.sides import ReferenceFailure

CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs two usable cores")


class _Tree:
    """What pinning needs of a side: its processes and where it is pinned."""

    def __init__(self, pid: int):
        self.pid, self.pinned_core, self.notes = pid, None, {}

    def tree(self) -> list[int]:
        return [self.pid]


def _affinities(pid: int) -> set[frozenset]:
    return {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}


@needs_two_cores
def test_a_pinned_side_is_spread_over_the_cores_and_pinned_back_thread_by_thread():
    code = "import threading, time\nfor _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\ntime.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{proc.pid}/task")) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        side = _Tree(proc.pid)
        assert not pinning.spread_side(side, set(CORES))  # never pinned: nothing to undo
        assert pinning.pin_side(side, CORES[0]) == 4 and _affinities(proc.pid) == {frozenset({CORES[0]})}
        assert pinning.spread_side(side, set(CORES[:2]))
        assert _affinities(proc.pid) == {frozenset(CORES[:2])}
        assert not pinning.spread_side(side, {CORES[0]})  # one core is no spread
        pinning.pin_side(side, side.pinned_core)
        assert _affinities(proc.pid) == {frozenset({CORES[0]})} and side.pinned_core == CORES[0]
    finally:
        proc.kill()
        proc.wait()


def _thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


@needs_two_cores
def test_the_cpu_oracle_runs_on_its_own_threads_which_end_with_it():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    x = torch.randn(2_000_000, dtype=torch.float64)
    try:
        torch.sigmoid(x)  # the main thread's own pool as it will be
        start, seen = _thread_count(), {}

        def forward():
            seen["threads"], seen["grad"] = torch.get_num_threads(), torch.is_grad_enabled()
            seen["running"] = _thread_count()
            return torch.sigmoid(x) * x

        out = on_threads(forward, 2)
        assert torch.equal(out, torch.sigmoid(x) * x)
        assert seen["threads"] == 2 and seen["running"] > start
        assert torch.get_num_threads() == 1
        deadline = time.monotonic() + 5
        while _thread_count() > start and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _thread_count() == start  # raised on the main thread instead, one OpenMP thread stays
        with pytest.raises(ValueError, match="the oracle failed"):
            on_threads(lambda: (_ for _ in ()).throw(ValueError("the oracle failed")), 2)
        assert torch.get_num_threads() == 1
        assert on_threads(lambda: torch.get_num_threads(), 1) == 1  # one thread: where it is called
    finally:
        torch.set_num_threads(before)


def test_the_thread_count_travels_validated():
    assert validate.decode(protocol.encode(Oracle(3, threads=8)), from_side=False) == Oracle(3, threads=8)
    assert validate.decode({"op": "oracle", "slot": 3}, from_side=False) == Oracle(3)
    for bad in (0, 17, "8", 2.0):
        with pytest.raises(ProtocolError):
            validate.decode({"op": "oracle", "slot": 3, "threads": bad}, from_side=False)
    request = Verify([], 16, {}, oracle_threads=16)
    assert validate.decode(protocol.encode(request), from_side=False) == request


class _Proc:
    """A reference side's process that records what is done to it."""

    def __init__(self, log: list, fails: bool = False):
        self.log, self.fails, self.pinned_core, self.alive = log, fails, 3, True

    def thaw(self):
        self.log.append("thaw")

    def freeze(self):
        self.log.append("freeze")

    def request(self, msg, timeout, expect):
        self.log.append("request")
        self.sent = msg
        if self.fails:
            self.alive = False
            raise ChildFailure("runtime_error", "the side died")
        return Verified(True, calls=[])

    def exit_info(self):
        return type("Exit", (), {"reason": "running" if self.alive else "exited"})()


def _asked(monkeypatch, request, fails: bool = False, spreads: bool = True) -> list:
    log: list = []
    monkeypatch.setattr(output_checks, "_cores", lambda config: {0, 1, 2, 3, 4})
    monkeypatch.setattr(pinning, "spread_side", lambda side, cores: log.append(("spread", side.pinned_core)) or spreads)
    monkeypatch.setattr(pinning, "pin_side", lambda side, core: log.append(("pin", core)))
    ref = type("Ref", (), {"proc": _Proc(log, fails)})()
    try:
        output_checks._ask_reference(ref, request, Verified, EvalConfig(device="cpu"), lambda: 10.0, "failed")
    except ReferenceFailure:
        assert fails
    sent = ref.proc.sent
    log.append(("threads", sent.threads if isinstance(sent, Oracle) else sent.oracle_threads))
    return log


def _call(mode: str) -> CallToVerify:
    return CallToVerify(ref_index=0, slot=0, mode=mode, bounds=[], seed=1, leaves=[])


def test_only_a_request_with_the_oracle_spreads_the_side_and_it_is_pinned_again_once_stopped(monkeypatch):
    spread_then_pinned = [("spread", 3), "thaw", "request", "freeze", ("pin", 3), ("threads", 5)]
    assert _asked(monkeypatch, Verify([_call("spots"), _call("oracle")], 16, {})) == spread_then_pinned
    assert _asked(monkeypatch, Oracle(0)) == spread_then_pinned
    assert _asked(monkeypatch, Verify([_call("spots"), _call("full")], 16, {})) == ["thaw", "request", "freeze", ("threads", 1)]
    # not spread (an unpinned side, one core): the oracle keeps one thread, and nothing is pinned back
    assert _asked(monkeypatch, Oracle(0), spreads=False) == [("spread", 3), "thaw", "request", "freeze", ("threads", 1)]
    # a side that died answering is neither stopped nor pinned (it is replaced)
    assert _asked(monkeypatch, Verify([_call("oracle")], 16, {}), fails=True) == [("spread", 3), "thaw", "request", ("threads", 5)]


def test_gpu_workers_time_on_cores_of_their_own_and_a_spread_oracle_keeps_off_the_others():
    cores = [0, 1, 2, 3, 4, 5, 6, 7]
    workers = ["cuda:0", "cuda:1", "cuda:2"]
    assigned = [pinning.gpu_worker_cores(workers, i, cores) for i in range(3)]
    assert [timed for timed, _ in assigned] == [1, 2, 3]  # not core 0, one each
    assert [busy for _, busy in assigned] == [(2, 3), (1, 3), (1, 2)]
    assert pinning.gpu_worker_cores(["cuda:0"], 0, cores) == (1, ())
    config = EvalConfig(device="cuda:0", timed_core=1, busy_cores=(2, 3))
    if hasattr(os, "sched_getaffinity"):
        assert output_checks._cores(config) == os.sched_getaffinity(0) - {2, 3}


def test_the_spread_gets_the_cores_less_the_other_workers(monkeypatch):
    given = []
    monkeypatch.setattr(pinning, "spread_side", lambda side, cores: given.append(set(cores)) or False)
    monkeypatch.setattr(output_checks, "_cores", lambda config: set(range(8)) - set(config.busy_cores))
    ref = type("Ref", (), {"proc": _Proc([])})()
    output_checks._ask_reference(ref, Oracle(0), Verified, EvalConfig(device="cpu", busy_cores=(2, 5)),
                                 lambda: 10.0, "failed")
    assert given == [{0, 1, 3, 4, 6, 7}]
