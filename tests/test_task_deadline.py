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


def test_the_deadline_stops_a_loop_on_a_helper_thread_and_spares_quick_code():
    """GPU workers prepare tasks ahead on helper threads; there a Python loop is stopped."""
    outcome = []

    def helper():
        try:
            with task_deadline(0.3, "importing x", "x.py"):
                _loop()
        except TaskError as exc:
            outcome.append(str(exc))
        with task_deadline(5, "importing y", "y.py"):
            time.sleep(0.05)
        outcome.append("quick")

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and "ran past its deadline" in outcome[0] and outcome[1] == "quick"


def test_no_stop_arrives_after_the_block_has_ended():
    """A deadline that passes just as its block ends must not stop the code after it."""
    for _ in range(300):
        with task_deadline(0.0005, "importing x", "x.py"):
            sum(range(200))
        time.sleep(0.002)  # a stop sent late would land here, outside any block


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
