"""A verdict lost to a crowded device is judged again alone (crowding.py): once, only on a GPU, only
when something else held the device, and the second verdict stands whatever it says."""

from __future__ import annotations

import time

import pytest

from cuda_l1.evaluate import crowding
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.device_room import DeviceRoom
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.evaluate.jobs import Evaluators
from cuda_l1.evaluate.lookahead import Lookahead
from cuda_l1.evaluate.verdict import OK, RUNTIME_ERROR, Check, Verdict
from cuda_l1.tasks import make_task
from task_sources import one_line_task

def relu_plus(k: int) -> str:
    return one_line_task(f"torch.relu(x) + {k}.0", "64, 64")

# What torch says when the caching allocator cannot serve a request (its message as on the H200).
RAISES_OUT_OF_MEMORY = '''

class ModelNew(Model):
    def forward(self, x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total "
                                     "capacity of 139.80 GiB of which 1.42 GiB is free.")
'''

# The same words in a candidate's own error: the retry is one more evaluation, nothing else.
SAYS_OUT_OF_MEMORY_IN_A_VALUE_ERROR = '''

class ModelNew(Model):
    def forward(self, x):
        raise ValueError("no CUDA out of memory here")
'''

H200_MESSAGES = [
    "the evaluation failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a "
    "total capacity of 139.80 GiB of which 1.13 GiB is free.",
    "the evaluation failed: CudaDriverError: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY",
    "forward raised:\nTraceback (candidate.py frames; 1 harness and library frame(s) left out):\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB.",
]


def _task(k: int = 1):
    return make_task(relu_plus(k), name=f"{k}_relu", level=1, origin=f"test:relu{k}")


def _config() -> EvalConfig:
    return EvalConfig(device="cpu", timing=TimingConfig.quick(), prewarm=False)


@pytest.mark.parametrize("message", H200_MESSAGES)
def test_the_words_of_an_out_of_memory_failure_are_recognised(message):
    assert crowding.ran_out_of_device_memory(Verdict(status=RUNTIME_ERROR, reasons=[message]))
    detail_only = Verdict(status=RUNTIME_ERROR, reasons=["the evaluation failed"],
                          checks=[Check("evaluator", False, message)])
    assert crowding.ran_out_of_device_memory(detail_only)


def test_other_failures_and_ok_verdicts_are_not_out_of_memory():
    assert not crowding.ran_out_of_device_memory(Verdict(status=RUNTIME_ERROR, reasons=["forward raised: ValueError"]))
    assert not crowding.ran_out_of_device_memory(Verdict(status=OK, reasons=[H200_MESSAGES[0]]))


GiB = 1 << 30


class ScriptedEvaluator:
    """An evaluator whose verdicts are given in advance (the decision around them is under test);
    each evaluation takes `takes` bytes of a simulated device for good."""

    def __init__(self, task, script: list, made: list, device: dict, takes: int = 0):
        self.task, self.script, self.device, self.takes = task, script, device, takes
        self.config = EvalConfig(device="cpu")
        self.seen_best: list = []
        made.append(self)

    def evaluate(self, source, **kwargs):
        self.seen_best.append(self.config.best_known_speedup)
        self.device["free"] -= self.takes
        if isinstance(self.script[0], Exception):
            raise self.script.pop(0)
        return self.script.pop(0)

    def close(self):
        pass


def _scripted(script: list, free: int, need: int = 10 * GiB, takes: int = 0):
    made: list = []
    device = {"free": free}
    room = DeviceRoom("cuda:0", free=lambda: device["free"], need=lambda source: need)
    evaluators = Evaluators(lambda task: ScriptedEvaluator(task, script, made, device, takes), keep=3, room=room)
    return evaluators, room, made, device


def test_an_out_of_memory_verdict_on_a_crowded_device_is_replaced_by_the_one_judged_alone():
    first, second = _task(1), _task(2)
    script = [Verdict(status=RUNTIME_ERROR, reasons=[H200_MESSAGES[0]], elapsed_s=2.0),
              Verdict(status=OK, speedup=1.0, elapsed_s=3.0)]
    # each evaluation takes 95 GiB of 100 for good: after the first, 5 GiB are free, less than the 12 needed
    evaluators, room, made, _ = _scripted(script, free=100 * GiB, takes=95 * GiB)
    evaluators.get(second)  # another task's reference, still held
    evaluator = evaluators.get(first)
    evaluator.config.best_known_speedup = 1.7
    verdict = crowding.judge(evaluator, "src", device="cuda:0", evaluators=evaluators, task=first,
                             ahead=Lookahead(evaluators, depth=0))
    assert verdict.status == OK and verdict.attempts == 2 and verdict.elapsed_s == 5.0
    assert verdict.timing["crowded_retry"] == {"beside": 1, "first_status": RUNTIME_ERROR,
                                               "first_reason": H200_MESSAGES[0]}
    # both held evaluators were closed, and this task's prepared again for the retry, with the best
    # known speedup carried over (the re-measure rule still applies)
    assert [e.task.id for e in made] == [second.id, first.id, first.id]
    assert made[2].seen_best == [1.7]
    assert evaluators.task_ids() == [first.id]
    # what the evaluation alone took is the task's need from now on (more than its estimate), and
    # while the task is held it is kept in reserve for any other task prepared beside it
    assert room.need(first) == 95 * GiB and room.need(second) == 10 * GiB
    room._free = lambda: 100 * GiB
    assert room.fits(second) and not room.fits(second, held=[first.id]) and room.fits(first, held=[first.id])
    evaluators.close()


def test_a_failure_that_is_not_out_of_memory_not_on_a_gpu_or_on_a_device_with_room_is_not_judged_again():
    """The words are the candidate's to write: on a device with room the failure stays its own."""
    task, other = _task(1), _task(2)
    for device, reason, free in (("cuda:0", "forward raised: ValueError", 1 * GiB), ("cpu", H200_MESSAGES[0], 1 * GiB),
                                 ("cuda:0", H200_MESSAGES[2], 100 * GiB)):
        evaluators, _, made, _ = _scripted([Verdict(status=RUNTIME_ERROR, reasons=[reason])], free=100 * GiB)
        evaluators.get(other)
        evaluator = evaluators.get(task)
        evaluators.room._free = lambda free=free: free
        verdict = crowding.judge(evaluator, "src", device=device, evaluators=evaluators, task=task)
        assert verdict.attempts == 1 and "crowded_retry" not in verdict.timing
        assert sorted(evaluators.task_ids()) == sorted([task.id, other.id])  # nothing retired
        evaluators.close()


def test_a_retry_that_cannot_be_prepared_leaves_the_first_verdict_standing():
    task, other = _task(1), _task(2)
    first = Verdict(status=RUNTIME_ERROR, reasons=[H200_MESSAGES[1]])
    evaluators, _, _, device = _scripted([first, RuntimeError("the reference's side could not start")],
                                         free=100 * GiB, takes=99 * GiB)
    evaluators.get(other)
    verdict = crowding.judge(evaluators.get(task), "src", device="cuda:0", evaluators=evaluators, task=task)
    assert verdict is first and verdict.attempts == 1
    assert verdict.timing["crowded_retry"] == {"beside": 1, "failed": "RuntimeError: the reference's side could not start"}
    evaluators.close()


@pytest.mark.timeout(300)
def test_a_candidate_out_of_memory_on_its_own_keeps_its_verdict_after_one_retry():
    """Real evaluations (CPU sides; the GPU rule applied by name, the device's free memory given): a
    candidate whose forward always raises torch.OutOfMemoryError is judged twice on a crowded device
    where another task and a load were held, once when alone, and its runtime_error stands either way;
    one that only says so in a ValueError on a device with room is judged once."""
    task, other = _task(1), _task(2)
    device = {"free": 100 * GiB}
    room = DeviceRoom("cuda:0", free=lambda: device["free"], need=lambda source: 1 * GiB)
    evaluators = Evaluators(lambda t: Evaluator(t, _config()), keep=3, room=room)
    ahead = Lookahead(evaluators, depth=1)
    try:
        evaluators.get(other)
        ahead.start("next", task, relu_plus(1) + SAYS_OUT_OF_MEMORY_IN_A_VALUE_ERROR, [task.id])
        evaluator = evaluators.get(task)
        says = crowding.judge(evaluator, relu_plus(1) + SAYS_OUT_OF_MEMORY_IN_A_VALUE_ERROR, device="cuda:0",
                              evaluators=evaluators, task=task, ahead=ahead)
        assert says.status == RUNTIME_ERROR and "no CUDA out of memory here" in says.reasons[0]
        assert says.attempts == 1 and "crowded_retry" not in says.timing  # the device had room
        device["free"] = 2 * GiB  # others hold the rest
        crowded = crowding.judge(evaluator, relu_plus(1) + RAISES_OUT_OF_MEMORY, device="cuda:0",
                                 evaluators=evaluators, task=task, ahead=ahead)
        assert crowded.status == RUNTIME_ERROR and "OutOfMemoryError" in crowded.reasons[0]
        assert crowded.attempts == 2 and crowded.timing["crowded_retry"]["beside"] == 2  # a task and a load
        assert ahead.started() == set() and evaluators.task_ids() == [task.id]
        alone = crowding.judge(evaluators.get(task), relu_plus(1) + RAISES_OUT_OF_MEMORY, device="cuda:0",
                               evaluators=evaluators, task=task, ahead=ahead)
        assert alone.status == RUNTIME_ERROR and alone.attempts == 1 and "crowded_retry" not in alone.timing
    finally:
        ahead.close()
        evaluators.close()


def test_a_reference_failing_beside_other_tasks_on_a_gpu_is_prepared_again_alone():
    """A task's preparation runs its reference once on the device (TaskEnv), and a reference that fails
    there is bad input that ends a bench (BrokenTask). Beside the other tasks a GPU worker holds, the
    failure may be the device's (out of memory, in whatever words): the worker drops them and prepares
    the task again; failing alone, the task is broken. Without a device (a CPU worker), it is at once."""
    from cuda_l1.errors import BrokenTask, TaskError

    failures: list = []

    def make(task):
        if failures:
            raise failures.pop(0)
        return ScriptedEvaluator(task, [], [], {"free": 0})

    room = DeviceRoom("cuda:0", free=lambda: 100 * GiB, need=lambda source: GiB)
    evaluators = Evaluators(make, keep=3, room=room)
    first, big = _task(1), _task(2)
    evaluators.get(first)
    failures.append(BrokenTask("9_big.py: Model.forward(*get_inputs()) raised RuntimeError: "
                               "CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert crowding.prepare(evaluators, None, big, ()).task is big
    assert evaluators.task_ids() == [big.id]  # the first task's evaluator was dropped for it

    evaluators.retire_all()  # nothing else held: the failure is the task's
    failures.append(BrokenTask("9_big.py: Model.forward(*get_inputs()) raised ValueError: forward broke"))
    with pytest.raises(BrokenTask, match="forward broke"):
        crowding.prepare(evaluators, None, big, ())
    # and it stays the task's: its next candidate is answered at once, its reference not run again
    # (make() would now succeed), nothing held dropped for it
    evaluators.get(first)
    with pytest.raises(BrokenTask, match="forward broke"):
        crowding.prepare(evaluators, None, big, ())
    assert evaluators.task_ids() == [first.id] and not failures
    evaluators.broken.clear()  # (the same task again below, as if new)

    evaluators.get(first)  # a failure made ahead, twice over: fails alone too
    failures.append(BrokenTask("2_relu.py: Model.forward(*get_inputs()) raised ValueError: forward broke"))
    with pytest.raises(BrokenTask, match="forward broke"):
        crowding.prepare(evaluators, None, big, (), failure=BrokenTask("2_relu.py: forward broke"))
    assert evaluators.task_ids() == []
    evaluators.broken.clear()

    evaluators.get(first)  # any other failure is raised as it is, nothing dropped for it
    with pytest.raises(TaskError, match="sandbox"):
        crowding.prepare(evaluators, None, big, (), failure=TaskError("the reference does not load in the sandbox"))
    assert evaluators.task_ids() == [first.id]

    on_cpu = Evaluators(make, keep=3)  # no device room: a CPU worker
    on_cpu.get(first)
    failures.append(BrokenTask("2_relu.py: forward broke"))
    with pytest.raises(BrokenTask):
        crowding.prepare(on_cpu, None, big, ())
    assert on_cpu.task_ids() == [first.id]
    with pytest.raises(BrokenTask, match="forward broke"):  # once is enough without a device
        crowding.prepare(on_cpu, None, big, ())


def test_a_thread_that_waited_for_a_failed_preparation_does_not_run_the_task_again():
    """A worker's load ahead of a task's next candidate waits while the task is prepared for the one
    judged now. When that preparation fails, the waiting thread hears the failure instead of running
    the broken reference once more (up to its deadline): crowding.prepare decides about trying again."""
    import threading

    from cuda_l1.errors import BrokenTask

    started, release, calls = threading.Event(), threading.Event(), []

    def make(task):
        calls.append(task.id)
        started.set()
        release.wait(10)
        raise BrokenTask("9_big.py: forward broke")

    evaluators = Evaluators(make, keep=2)
    big, heard = _task(2), []

    def wait_for_it():
        try:
            evaluators.get(big)
        except BrokenTask as exc:
            heard.append(str(exc))

    first = threading.Thread(target=wait_for_it)
    first.start()
    assert started.wait(10)
    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    time.sleep(0.2)  # the waiter is waiting on the preparation under way
    release.set()
    first.join(10)
    waiter.join(10)
    assert calls == [big.id] and heard == ["9_big.py: forward broke"] * 2


def test_a_wait_that_ran_out_is_not_remembered_as_a_broken_task():
    """A job that waited too long for another thread's preparation of its task fails as the task's, but
    proves nothing of the reference: the task's next job prepares it again."""
    from cuda_l1.evaluate.jobs import PreparationWait

    evaluators = Evaluators(lambda task: ScriptedEvaluator(task, [], [], {"free": 0}), keep=2)
    big = _task(2)
    with pytest.raises(PreparationWait):
        crowding.prepare(evaluators, None, big, (), failure=PreparationWait("9_big.py: preparing took longer"))
    assert evaluators.broken == {}
    assert crowding.prepare(evaluators, None, big, ()).task is big
