"""A task's own code runs in trusted processes (the evaluator's, a worker's, `tasks show`'s) with a
deadline: a task file that sleeps or loops forever is reported broken, where it hung every command."""

from __future__ import annotations

import dataclasses
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


def test_a_worker_reports_a_hanging_task_as_bad_input(tmp_path):
    """`bench` hung for good on a task that sleeps at import: its worker prepared the task with no
    deadline. Now the run ends as bad input naming the file."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "1_sleepy.py").write_text(_task(import_hang="time.sleep(10**6)").source)
    config = EvalConfig(device="cpu", timing=TimingConfig.quick(), task_timeout_s=2.0)
    started = time.monotonic()
    with pytest.raises((UserError, TaskError), match="1_sleepy.py.*ran past its deadline of 2 s"):
        run_bench(str(folder), str(tmp_path / "run"), strategies=["eager"], levels=None, device="cpu",
                  config=dataclasses.replace(config), progress=False)
    assert time.monotonic() - started < 60


def test_the_callers_reference_checks_and_the_memory_estimate_keep_the_configured_deadline():
    """`eval`, `optimize`, `calibrate` and `bench --calibrate` check references with the config's
    task_timeout_s, and a GPU worker's memory estimate runs the task's code within it too (both took
    the 300 s default whatever was configured)."""
    from cuda_l1.bench import check_references
    from cuda_l1.devices import as_device
    from cuda_l1.evaluate.device_room import DeviceRoom

    task = _task(import_hang="time.sleep(10**6)")
    started = time.monotonic()
    with pytest.raises(TaskError, match="hangs.py: importing the task ran past its deadline of 1 s"):
        check_references([task], as_device("cpu"), timeout_s=1.0)
    room = DeviceRoom("cuda:0", free=lambda: 1 << 40, task_timeout_s=1.0)
    assert room._need(task.source) == 0  # an estimate only: none for a task that hangs, and no hang
    assert time.monotonic() - started < 10
