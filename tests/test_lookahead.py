"""Candidates loaded ahead (lookahead.py): the same verdicts as without, nothing of theirs running
beside a timed window, their failures reported as their own, and a worker's queue that survives
the worker's death."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.device_room import DeviceRoom, task_bytes
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.evaluate.jobs import EvalJob, Evaluators
from cuda_l1.evaluate.local_pool import LocalPool
from cuda_l1.evaluate.lookahead import Lookahead
from cuda_l1.evaluate.sandbox import ChildFailure
from cuda_l1.evaluate.side_supply import SideSupply
from cuda_l1.evaluate.verdict import INCORRECT, OK, REJECTED, RUNTIME_ERROR, TIMEOUT
from cuda_l1.tasks import make_task
from task_sources import one_line_task

LINUX = Path("/proc/self/stat").exists()

TASK = one_line_task("torch.tanh(x) * 2.0", "128, 128")

MODEL_NEW = '''

class ModelNew(Model):
    pass
'''

# Its import keeps a thread busy for seconds: the side is "loading" for that long.
SPINS_WHILE_LOADING = '''
import threading, time

def _spin():
    end = time.monotonic() + {seconds}
    x = 0
    while time.monotonic() < end:
        x += 1

_spin()


class ModelNew(Model):
    pass
'''

WRONG = '''

class ModelNew(Model):
    def forward(self, x):
        return super().forward(x) * 1.1
'''

MUTATES = '''

class ModelNew(Model):
    def forward(self, x):
        out = super().forward(x)
        x.mul_(0.5)
        return out
'''

DIES_AT_IMPORT = '''
import os
os._exit(3)


class ModelNew(Model):
    pass
'''


def _task():
    return make_task(TASK, name="1_tanh", level=1, origin="test:tanh")


def _config(**changes) -> EvalConfig:
    timing = TimingConfig.quick()
    config = EvalConfig(device="cpu", timing=timing, prewarm=False)
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def _cpu_ticks(pids) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total


# -- the supply's gate and background sides (fake sides) ----------------------------------------------
class FakeSide:
    def __init__(self, stoppable: bool = True):
        self.frozen, self.stoppable, self.calls = set(), stoppable, []

    def freeze(self, timeout: float = 2.0):
        self.calls.append("freeze")
        if not self.stoppable:
            raise ChildFailure(REJECTED, "the side could not be stopped between windows")
        self.frozen = {1}

    def thaw(self):
        self.calls.append("thaw")
        self.frozen = set()


def test_a_window_stops_background_sides_and_holds_the_gate():
    supply = SideSupply(prewarm=False)
    loading, stuck = FakeSide(), FakeSide(stoppable=False)
    supply.track(loading)
    supply.track(stuck)
    entered = threading.Event()

    def helper():  # a helper thread's step: it must wait for the window to end
        with supply.gate:
            entered.set()

    settled = []
    with supply.stopped(settle=lambda: settled.append(True)):
        assert loading.frozen and settled == [True]
        thread = threading.Thread(target=helper)
        thread.start()
        time.sleep(0.2)
        assert not entered.is_set()  # no helper step runs during a window
    thread.join(5)
    assert entered.is_set() and loading.calls == ["freeze", "thaw"] and not loading.frozen
    # The side that could not be stopped: its helper learns why, once.
    failure = supply.untrack(stuck)
    assert isinstance(failure, ChildFailure) and "could not be stopped" in str(failure)
    assert supply.untrack(stuck) is None and supply.untrack(loading) is None
    with supply.stopped():  # untracked: left alone
        pass
    assert loading.calls == ["freeze", "thaw"]


def test_evaluators_prepare_a_task_once_and_keep_busy_ones():
    made, closed = [], []

    class Ev:
        def __init__(self, task):
            made.append(task.id)
            time.sleep(0.2)
            self.task = task

        def close(self):
            closed.append(self.task.id)

    tasks = [make_task(TASK.replace("2.0", f"{k}.0"), name=f"{k}_t", level=1, origin=f"test:{k}") for k in range(3)]
    evaluators = Evaluators(Ev, keep=1)
    got = []
    threads = [threading.Thread(target=lambda: got.append(evaluators.get(tasks[0]))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [tasks[0].id] and len({id(e) for e in got}) == 1  # prepared once, shared
    evaluators.get(tasks[1], busy=[tasks[0].id])  # over `keep`, but task 0 is still needed
    assert closed == []
    evaluators.get(tasks[2])  # now the oldest unneeded ones go
    assert closed == [tasks[0].id, tasks[1].id]
    evaluators.close()


def test_without_room_on_the_device_a_task_waits_for_its_turn_and_then_retires_the_rest():
    """KernelBench level 1 on the H200: three elementwise tasks of 6 GiB inputs held at once left the
    next one's float64 oracle without memory. A task needing more than is free is not prepared ahead,
    and in its own turn every held evaluator no busy task needs is closed first."""
    GiB = 1 << 30
    held_bytes = {}  # task id -> device bytes its evaluator holds
    closed, cached_released = [], []

    class Ev:
        def __init__(self, task):
            self.task = task
            held_bytes[task.id] = 40 * GiB

        def close(self):
            closed.append(self.task.id)
            held_bytes.pop(self.task.id)

    class Room(DeviceRoom):
        def release_cached(self):
            cached_released.append(True)

    room = Room("cuda", free=lambda: 140 * GiB - sum(held_bytes.values()), need=lambda source: 40 * GiB)
    tasks = [make_task(TASK.replace("2.0", f"{k}.0"), name=f"{k}_t", level=1, origin=f"test:{k}") for k in range(4)]
    evaluators = Evaluators(Ev, keep=4, room=room)  # the room, not `keep`, retires here
    ahead = Lookahead(evaluators, depth=1)
    try:
        evaluators.get(tasks[0])
        evaluators.get(tasks[1])
        assert evaluators.fits(tasks[2]) and evaluators.fits(tasks[3])  # 60 GiB free, 40 needed
        evaluators.get(tasks[2], busy=[tasks[1].id])
        assert not evaluators.fits(tasks[3]) and evaluators.fits(tasks[2])  # 20 GiB free; a held task fits
        ahead.start("next", tasks[3], TASK + MODEL_NEW, [tasks[2].id])
        assert ahead.take("next") == (None, None, None)  # not loaded ahead: judged in its own turn
        assert tasks[3].id not in evaluators.task_ids() and closed == []
        evaluators.get(tasks[3], busy=[tasks[2].id])  # its turn: 0 and 1 go (2 is busy), then room
        assert closed == [tasks[0].id, tasks[1].id] and cached_released
        assert set(evaluators.task_ids()) == {tasks[2].id, tasks[3].id}
    finally:
        ahead.close()
        evaluators.close()


def test_a_task_needs_room_for_its_inputs_and_outputs_several_times_over():
    # KernelBench level 1's LeakyReLU: a 4096 x 393216 float32 input and output (6 GiB each), on the
    # meta device (no memory): 6 copies of the input and 6 of the output.
    leaky = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
             "    def forward(self, x):\n        return torch.nn.functional.leaky_relu(x, 0.01)\n\n"
             "def get_inputs():\n    return [torch.rand(4096, 393216)]\n\ndef get_init_inputs():\n    return []\n")
    assert task_bytes(leaky) == 12 * 4096 * 393216 * 4
    assert task_bytes("raise RuntimeError('no shapes here')") == 0  # unknown: not held back
    room = DeviceRoom("cuda", free=lambda: 60 << 30, need=task_bytes)
    task = make_task(leaky, name="20_LeakyReLU", level=1, origin="test:leaky")
    assert not room.fits(task)  # 72 GiB does not fit in 60 free
    assert DeviceRoom("cuda", free=lambda: 80 << 30, need=task_bytes).fits(task)
    # AvgPool2d: a 16 GiB input, a small output; the float64 oracle's copy of the input counts.
    pool = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
            "    def forward(self, x):\n        return torch.nn.functional.avg_pool2d(x, 11)\n\n"
            "def get_inputs():\n    return [torch.rand(16, 64, 2048, 2048)]\n\ndef get_init_inputs():\n    return []\n")
    assert task_bytes(pool) >= 6 * 16 * 64 * 2048 * 2048 * 4


# -- real sides on the CPU --------------------------------------------------------------------------
@pytest.mark.skipif(not LINUX, reason="reads /proc")
@pytest.mark.timeout(400)
def test_loaded_ahead_candidates_get_the_verdicts_they_get_without():
    task = _task()
    evaluators = Evaluators(lambda t: Evaluator(t, _config()), keep=3)
    ahead = Lookahead(evaluators, depth=2)
    try:
        first = evaluators.get(task, [task.id])
        sources = {"wrong": TASK + WRONG, "mutates": TASK + MUTATES, "dies": TASK + DIES_AT_IMPORT,
                   "same": TASK + MODEL_NEW}
        ahead.start("wrong", task, sources["wrong"], [task.id])
        ahead.start("mutates", task, sources["mutates"], [task.id])
        direct = first.evaluate(TASK + MODEL_NEW)  # timed while the two load beside it
        assert direct.status == OK, direct.reasons
        verdicts = {}
        for key in ("wrong", "mutates", "dies", "same"):
            ahead.start(key, task, sources[key], [task.id])
            evaluator, preloaded, error = ahead.take(key)
            assert error is None and evaluator is first and preloaded.source == sources[key]
            verdicts[key] = evaluator.evaluate(sources[key], preloaded=preloaded)
            assert verdicts[key].timing["phases_s"]["load"] > 0
        assert verdicts["wrong"].status == INCORRECT, verdicts["wrong"].reasons
        assert verdicts["mutates"].status == REJECTED, verdicts["mutates"].reasons
        assert verdicts["mutates"].checks and any(c.name == "inputs_unchanged" and c.passed is False
                                                  for c in verdicts["mutates"].checks)
        assert verdicts["dies"].status in (RUNTIME_ERROR, "compile_error"), verdicts["dies"].reasons
        assert verdicts["same"].status == OK, verdicts["same"].reasons
    finally:
        ahead.close()
        evaluators.close()


@pytest.mark.skipif(not LINUX, reason="reads /proc")
@pytest.mark.timeout(300)
def test_a_loading_side_runs_between_windows_only_and_stays_stopped_once_loaded():
    task = _task()
    evaluator = Evaluator(task, _config())
    # A thread that outlives the side, as a worker's helper threads do: a side's parent-death signal
    # fires when the thread that started it ends.
    helper = ThreadPoolExecutor(max_workers=1)
    try:
        loading = helper.submit(evaluator.preload, TASK + SPINS_WHILE_LOADING.format(seconds=6))
        deadline = time.monotonic() + 60
        while not evaluator.supply._background and time.monotonic() < deadline:
            time.sleep(0.05)
        [side] = evaluator.supply._background
        time.sleep(3.0)  # the interpreter and torch are up; the candidate's import spins now
        before = _cpu_ticks(side.tree())
        time.sleep(0.5)
        assert _cpu_ticks(side.tree()) > before  # it works in the background
        with evaluator.supply.stopped():  # what every timed window does
            assert side.frozen
            before = _cpu_ticks(side.tree())
            time.sleep(1.0)
            assert _cpu_ticks(side.tree()) <= before + 1  # nothing of it runs during a window
        preloaded = loading.result(timeout=120)
        assert preloaded.failure is None and preloaded.proc.frozen  # loaded, and stopped since
        before = _cpu_ticks(preloaded.proc.tree())
        time.sleep(0.5)
        assert _cpu_ticks(preloaded.proc.tree()) <= before + 1
        verdict = evaluator.evaluate(preloaded.source, preloaded=preloaded)
        assert verdict.status == OK, verdict.reasons
    finally:
        helper.shutdown(wait=True)
        evaluator.close()


@pytest.mark.skipif(not LINUX, reason="reads /proc")
@pytest.mark.timeout(300)
def test_a_load_past_the_time_limit_is_the_candidates_timeout():
    task = _task()
    evaluator = Evaluator(task, _config(timeout_s=20.0))
    try:
        preloaded = evaluator.preload(TASK + SPINS_WHILE_LOADING.format(seconds=120))
        verdict = evaluator.evaluate(preloaded.source, preloaded=preloaded)
        assert verdict.status == TIMEOUT, verdict.reasons
        assert verdict.elapsed_s < 60
    finally:
        evaluator.close()


@pytest.mark.skipif(not LINUX, reason="reads /proc")
@pytest.mark.timeout(600)
def test_a_pool_with_lookahead_judges_every_job_even_when_its_worker_dies():
    """Four jobs sent to one worker at once (one judged, two loaded ahead, one waiting); the worker is
    killed while it judges: every job still gets its own verdict, and none is charged the death."""
    task = _task()
    sources = [TASK + MODEL_NEW, TASK + WRONG, TASK + MUTATES, TASK + MODEL_NEW.replace("pass", "x = 1")]
    expected = [OK, INCORRECT, REJECTED, OK]
    config = _config(lookahead=2)
    with LocalPool("cpu", config, workers=1) as pool:
        futures = [pool.submit(EvalJob(task, source)) for source in sources]
        deadline = time.monotonic() + 120
        # Judging, past the task's own preparation: a death while a task's code runs is the task's
        # (task_marks.py), and here the candidate's is meant.
        while (pool._judging[0] is None or pool._slots[0][2].read()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(pool._inflight[0]) == 3  # one judged, two loaded ahead
        [worker] = pool.worker_pids()
        os.kill(worker, signal.SIGKILL)
        results = [f.result(timeout=400) for f in futures]
    for result, status in zip(results, expected):
        assert result.verdict.status == status, (result.verdict.status, result.verdict.reasons)
    assert results[0].attempts == 2 and all(r.attempts == 1 for r in results[1:])


def test_a_worker_prepares_one_new_task_at_a_time():
    from cuda_l1.evaluate.lookahead import load_ahead

    class Ahead:
        def __init__(self):
            self.jobs = []

        def started(self):
            return set(self.jobs)

        def start(self, key, task, source, busy):
            self.jobs.append(key)

    class T:
        def __init__(self, id):
            self.id = id

    a, b, c = T("a"), T("b"), T("c")
    queue = [(0, a, "s"), (1, a, "s"), (2, b, "s"), (3, c, "s")]
    ahead = Ahead()
    load_ahead(ahead, queue, 3, ready={"a"}, busy=set())
    assert ahead.jobs == [1, 2]  # task b is prepared ahead; c waits until b is ready
    load_ahead(ahead, queue[1:], 3, ready={"a"}, busy=set())
    assert ahead.jobs == [1, 2]
    load_ahead(ahead, queue[1:], 3, ready={"a", "b"}, busy=set())
    assert ahead.jobs == [1, 2, 3]
    fresh = Ahead()  # the job being judged is of a task not yet prepared: none other starts
    load_ahead(fresh, [(0, a, "s"), (1, b, "s"), (2, a, "s")], 2, ready=set(), busy=set())
    assert fresh.jobs == [2]


def test_a_background_side_that_keeps_the_device_busy_is_ended_for_it():
    supply = SideSupply(prewarm=False)

    class Busy(FakeSide):
        killed = ""

        def kill(self, why=""):
            self.killed = why
            self.frozen = set()

    side = Busy()
    supply.track(side)
    settles = []

    def settle():  # the device stays busy the first time, then goes idle
        settles.append(True)
        if len(settles) == 1:
            raise TimeoutError("the device stayed busy after the window")

    with supply.stopped(settle=settle):
        pass
    assert len(settles) == 2 and "busy" in side.killed
    failure = supply.untrack(side)
    assert isinstance(failure, ChildFailure) and failure.kind == REJECTED and "device busy" in str(failure)
