"""A task's own code runs in trusted processes (the evaluator's, a worker's, `tasks show`'s) with a
deadline: a task file that sleeps or loops forever is reported broken, where it hung every command."""

from __future__ import annotations

import dataclasses
import re
import textwrap
import threading
import time

import pytest

from cuda_l1.bench import run_bench
from cuda_l1.errors import BrokenTask, TaskError, UserError
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.evaluate.jobs import Evaluators
from cuda_l1.tasks import make_task
from cuda_l1.tasks.deadline import task_deadline
from cuda_l1.tasks.runtime import check_reference, describe_task

TASK = textwrap.dedent('''
    import time
    import torch
    import torch.nn as nn
    IMPORT_HANG


    class Model(nn.Module):
        def forward(self, x):
            FORWARD_HANG
            return x * 2


    def get_inputs():
        INPUTS_HANG
        return [torch.randn(64)]


    def get_init_inputs():
        return []
''')


def _task(import_hang="pass", forward_hang="pass", inputs_hang="pass", name="hangs"):
    source = (TASK.replace("IMPORT_HANG", import_hang).replace("FORWARD_HANG", forward_hang)
              .replace("INPUTS_HANG", inputs_hang))
    return make_task(source, name=name, level=1, origin=f"{name}.py")


def _loop():
    while True:
        pass


@pytest.mark.parametrize("body", [lambda: time.sleep(100), _loop], ids=["sleep", "loop"])
def test_the_deadline_stops_the_main_thread_in_a_sleep_or_a_loop(body):
    started = time.monotonic()
    with pytest.raises(TaskError, match="importing x ran past its deadline of 0.3 s"):
        with task_deadline(0.3, "importing x", "x.py"):
            body()
    assert time.monotonic() - started < 3


def test_a_helper_thread_is_never_interrupted():
    """An exception sent to another thread can land after its block ended, in code that is not the
    task's: on helper threads the deadline interrupts nothing (the worker bounds its wait instead)."""
    outcome = []

    def helper():
        with task_deadline(0.05, "importing y", "y.py"):
            time.sleep(0.3)
        outcome.append("finished")

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join(10)
    assert outcome == ["finished"]


def test_a_worker_waits_a_bounded_time_for_a_task_another_thread_prepares():
    """Where the deadline interrupts nothing (a helper thread), a task whose preparation never ends
    must not hold the worker for good: a second caller of the same task waits `wait_s`, then gets
    BrokenTask, while the preparing thread goes on."""
    task = _task()
    started, release = threading.Event(), threading.Event()
    prepared = object()

    def make(_task):
        started.set()
        release.wait(30)  # the task's own code, stuck until the test lets it go
        return prepared

    evaluators = Evaluators(make, wait_s=0.5)
    preparer_got, waiter_got = [], []
    preparer = threading.Thread(target=lambda: preparer_got.append(evaluators.get(task)))

    def wait_for_it():
        try:
            waiter_got.append(evaluators.get(task))
        except BrokenTask as exc:
            waiter_got.append(exc)

    waiter = threading.Thread(target=wait_for_it)
    try:
        preparer.start()
        assert started.wait(10)
        began = time.monotonic()
        waiter.start()
        waiter.join(10)
        waited = time.monotonic() - began
        assert not waiter.is_alive() and len(waiter_got) == 1
        assert isinstance(waiter_got[0], BrokenTask)
        assert "hangs.py: preparing the task on another thread took longer than" in str(waiter_got[0])
        assert 0.4 <= waited < 5
        assert preparer.is_alive() and preparer_got == []  # its preparation goes on, undisturbed
    finally:
        release.set()
        preparer.join(10)
        waiter.join(10)
    assert preparer_got == [prepared]
    assert evaluators.get(task) is prepared  # prepared once, then held for later callers


def test_a_retired_evaluator_that_fails_to_close_leaves_no_task_marked_as_preparing():
    """Making room for a task closes the evaluators it retires; one whose close raised (a reference
    side on a device in error) left the new task marked as being prepared for good, so each later
    job of it waited the whole wait and was then listed as a broken task."""
    from types import SimpleNamespace

    class Held:
        def __init__(self, fails: bool):
            self.fails, self.closed = fails, False

        def close(self):
            self.closed = True
            if self.fails:
                raise RuntimeError("the reference side could not be closed")

    made = {}

    def make(task):
        made[task.id] = Held(fails=task.id in ("a", "b"))
        return made[task.id]

    tasks = {name: SimpleNamespace(id=name, name=name, origin=name) for name in "abc"}
    evaluators = Evaluators(make, keep=2, wait_s=0.5)
    evaluators.get(tasks["a"])
    evaluators.get(tasks["b"])
    with pytest.raises(RuntimeError, match="could not be closed"):
        evaluators.get(tasks["c"])  # retires a, whose close fails
    began = time.monotonic()
    assert evaluators.get(tasks["c"]) is made["c"]  # prepared now, not waited for
    assert time.monotonic() - began < 0.4
    with pytest.raises(RuntimeError):
        evaluators._close([made["b"], made["c"]])  # one close failing still closes the others
    assert made["c"].closed


def test_no_stop_lands_after_its_block_has_ended():
    """A deadline that passes just as its block ends (blocks as long as their deadline, on a busy host
    too) must neither escape as anything but a TaskError nor stop the code after the block."""
    from cuda_l1.tasks import deadline

    stopped = 0
    for i in range(160):
        try:
            with task_deadline(0.004, "importing x", "x.py"):
                end = time.perf_counter() + 0.002 * (1 + i % 8)  # 2-16 ms: around the deadline, both sides
                while time.perf_counter() < end:
                    pass
        except TaskError:
            stopped += 1
        time.sleep(0.003)  # a stop sent late would land here, outside any block
    time.sleep(deadline.RESEND_S + 0.2)  # and a watcher left sending would land here
    assert deadline._current is None
    assert not [t for t in threading.enumerate() if t.name == "cuda-l1-task-deadline"]
    assert 0 < stopped < 160  # both outcomes occurred: the race was run


def test_a_task_that_hangs_at_import_or_in_its_first_run_is_broken_not_a_hang():
    config = EvalConfig(device="cpu", timing=TimingConfig.quick(), task_timeout_s=1.0)
    for task, step in [(_task(import_hang="time.sleep(10**6)"), "importing the task"),
                       (_task(forward_hang="while True: pass"), "the reference's first run"),
                       (_task(inputs_hang="time.sleep(10**6)"), "the reference's first run")]:
        started = time.monotonic()
        with pytest.raises(BrokenTask, match=f"hangs.py: {step}.* ran past its deadline of 1 s") as raised:
            Evaluator(task, config)
        assert "raised" not in str(raised.value)  # the deadline's own words, not wrapped in another error
        assert time.monotonic() - started < 10
        with pytest.raises(TaskError, match="ran past its deadline"):
            check_reference(task, timeout_s=1.0)
    with pytest.raises(TaskError, match="building the task's model and inputs ran past"):
        describe_task(_task(inputs_hang="time.sleep(10**6)"), timeout_s=1.0)


@pytest.mark.parametrize("later", ["time.sleep(10**6)", "raise ValueError('the data source is gone')"],
                         ids=["hangs", "raises"])
def test_a_task_whose_inputs_fail_in_a_later_round_is_broken_not_the_candidates_error(later):
    """get_inputs runs again for every round. One that hung there held the worker with no deadline;
    one that raised there was the candidate's runtime_error (judged again, as an evaluation failure).
    Both are now the task's: BrokenTask, bad input, within the task's deadline."""
    counted = ("CALLS = [0]\n" + TASK).replace(
        "INPUTS_HANG", f"CALLS[0] += 1\n    if CALLS[0] > 6:\n        {later}")
    task = make_task(counted.replace("IMPORT_HANG", "").replace("FORWARD_HANG", "pass"), name="later",
                     level=1, origin="later.py")
    config = EvalConfig(device="cpu", timing=TimingConfig.quick(), task_timeout_s=2.0)
    evaluator = Evaluator(task, config)  # its first calls (the reference's run, the layout) are fine
    started = time.monotonic()
    try:
        with pytest.raises(BrokenTask, match="later.py: .*(ran past its deadline of 2 s|the data source is gone)"):
            evaluator.evaluate(task.source.replace("class Model(", "class ModelNew("))
    finally:
        evaluator.close()
    assert time.monotonic() - started < 60


def test_a_worker_reports_a_hanging_task_as_bad_input(tmp_path):
    """`bench` hung for good on a task that sleeps at import: its worker prepared the task with no
    deadline. Now the task is bad input naming the file, left unjudged (the command exits 2 after the run)."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "1_sleepy.py").write_text(_task(import_hang="time.sleep(10**6)").source)
    config = EvalConfig(device="cpu", timing=TimingConfig.quick(), task_timeout_s=2.0)
    started = time.monotonic()
    result = run_bench(str(folder), str(tmp_path / "run"), strategies=["eager"], levels=None, device="cpu",
                       config=dataclasses.replace(config), progress=False)
    [broken] = result["counts"]["broken_tasks"].values()
    assert re.search("1_sleepy.py.*ran past its deadline of 2 s", broken["why"]), broken
    assert time.monotonic() - started < 60


def test_the_callers_reference_checks_and_the_memory_estimate_keep_the_configured_deadline():
    """`eval`, `optimize`, `calibrate` and `bench --calibrate` check references with the config's
    task_timeout_s, and a GPU worker's memory estimate runs the task's code within it too (both took
    the 300 s default whatever was configured)."""
    from cuda_l1.reference_runs import check_references
    from cuda_l1.devices import as_device
    from cuda_l1.evaluate.device_room import DeviceRoom

    task = _task(import_hang="time.sleep(10**6)")
    started = time.monotonic()
    with pytest.raises(TaskError, match="hangs.py: importing the task ran past its deadline of 1 s"):
        check_references([task], as_device("cpu"), timeout_s=1.0)
    room = DeviceRoom("cuda:0", free=lambda: 1 << 40, task_timeout_s=1.0)
    assert room._need(task.source) == 0  # an estimate only: none for a task that hangs, and no hang
    assert time.monotonic() - started < 10


WATCHED = '''
import multiprocessing, threading, time
from cuda_l1.evaluate import task_marks

marks = task_marks.PreparingMarks(multiprocessing.get_context("spawn"))
task_marks.install(marks)


def task_code():
    with task_marks.running_task_code("hangs", limit_s=LIMIT):
        time.sleep(SLEEP)


if ON_MAIN:
    task_code()
else:
    helper = threading.Thread(target=task_code, daemon=True)
    helper.start()
    helper.join()
print("ended", marks.read())
'''


def _watched(limit_s: float, sleep_s: float, on_main: bool = False):
    import subprocess
    import sys
    from pathlib import Path

    import cuda_l1

    script = (WATCHED.replace("LIMIT", repr(limit_s)).replace("SLEEP", repr(sleep_s))
              .replace("ON_MAIN", repr(on_main)))
    env = {"PYTHONPATH": str(Path(cuda_l1.__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    return proc, time.monotonic() - started


def test_a_task_stuck_on_a_workers_helper_thread_ends_the_worker_with_its_mark_standing():
    """No deadline interrupts a helper thread, and one stuck in a task's code held the device gate
    and the locks the worker's every window needs: the worker hung for good. Past its limit the block
    ends the worker instead, its mark left for the pool to charge the task."""
    from cuda_l1.evaluate.task_marks import STUCK_EXIT

    proc, took = _watched(limit_s=1.0, sleep_s=60)
    assert proc.returncode == STUCK_EXIT and "ended" not in proc.stdout, (proc.returncode, proc.stderr)
    assert "task hangs's own code ran past 1 s on a helper thread" in proc.stderr
    assert took < 30
    # A block that ends in time, and the main thread (whose own deadlines interrupt it), go on.
    proc, _ = _watched(limit_s=5.0, sleep_s=0.2)
    assert proc.returncode == 0 and "ended []" in proc.stdout, proc.stderr
    proc, _ = _watched(limit_s=0.3, sleep_s=1.0, on_main=True)
    assert proc.returncode == 0 and "ended []" in proc.stdout, proc.stderr


def test_a_hanging_memory_estimate_holds_up_no_other_task():
    """A GPU worker's memory estimate runs a task's module on a helper thread; it held the room's lock
    meanwhile, and the main thread's estimate of any other task waited on it with no bound."""
    import math

    from cuda_l1.evaluate.device_room import DeviceRoom

    release = threading.Event()

    def need(source: str) -> int:
        if "10**6" in source:
            release.wait(30)
        return 7

    room = DeviceRoom("cuda:0", free=lambda: 1 << 40, need=need)
    hanging, plain = _task(import_hang="time.sleep(10**6)", name="stuck"), _task(name="plain")
    estimating = threading.Thread(target=room.need, args=(hanging,))
    try:
        estimating.start()
        time.sleep(0.2)
        began = time.monotonic()
        assert room.need(plain) == 7
        assert time.monotonic() - began < 2
    finally:
        release.set()
        estimating.join(10)
    assert room.need(hanging) == 7  # known once it ended
    # An infinite task_timeout_s is no limit, not an overflow in a worker's bounded wait.
    assert Evaluators(lambda task: object(), wait_s=2 * math.inf + 900).wait_s is None


def test_tasks_show_takes_a_deadline_for_the_tasks_own_code(tmp_path):
    """`tasks show` builds a task's inputs in its own process: a task whose get_inputs sleeps is broken
    past --timeout (it waited the 300 s default with no way to say less)."""
    import subprocess
    import sys

    path = tmp_path / "sleepy.py"
    path.write_text(textwrap.dedent('''
        import time
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                return x

        def get_inputs():
            time.sleep(100)
            return [torch.randn(4)]

        def get_init_inputs():
            return []
    '''))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cuda_l1", "tasks", "show", str(path), "sleepy", "--timeout", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "ran past its deadline of 2 s" in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - started < 60 and "Traceback" not in proc.stderr
