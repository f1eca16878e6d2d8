"""A verdict lost to a crowded device is judged again alone (crowding.py): once, only on a GPU, only
when something else held the device, and the second verdict stands whatever it says."""

from __future__ import annotations

import pytest

from cuda_l1.evaluate import crowding
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.device_room import DeviceRoom
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.evaluate.jobs import Evaluators
from cuda_l1.evaluate.lookahead import Lookahead
from cuda_l1.evaluate.verdict import OK, RUNTIME_ERROR, Check, Verdict
from cuda_l1.tasks import make_task

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) + {k}.0


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''

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
    return make_task(TASK.format(k=k), name=f"{k}_relu", level=1, origin=f"test:relu{k}")


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

    def __init__(self, task, script: list, made: list, device: dict | None = None, takes: int = 0):
        self.task, self.script, self.calls, self.device, self.takes = task, script, 0, device, takes
        made.append(self)

    def evaluate(self, source, **kwargs):
        self.calls += 1
        if self.device is not None:
            self.device["free"] -= self.takes
        return self.script.pop(0)

    def close(self):
        pass


def test_an_out_of_memory_verdict_beside_another_task_is_replaced_by_the_one_judged_alone():
    first, second = _task(1), _task(2)
    script = [Verdict(status=RUNTIME_ERROR, reasons=[H200_MESSAGES[0]], elapsed_s=2.0),
              Verdict(status=OK, speedup=1.0, elapsed_s=3.0)]
    made: list = []
    device = {"free": 100 * GiB}
    room = DeviceRoom("cuda:0", free=lambda: device["free"], need=lambda source: 10 * GiB)
    evaluators = Evaluators(lambda task: ScriptedEvaluator(task, script, made, device, takes=30 * GiB), keep=3,
                            room=room)
    evaluators.get(second)  # another task's reference, still held
    evaluator = evaluators.get(first)
    verdict = crowding.judge(evaluator, "src", device="cuda:0", evaluators=evaluators, task=first,
                             ahead=Lookahead(evaluators, depth=0))
    assert verdict.status == OK and verdict.attempts == 2 and verdict.elapsed_s == 5.0
    assert verdict.timing["crowded_retry"] == {"beside": 1, "first_status": RUNTIME_ERROR,
                                               "first_reason": H200_MESSAGES[0]}
    # both held evaluators were closed, and this task's prepared again for the retry
    assert [e.task.id for e in made] == [second.id, first.id, first.id]
    assert evaluators.task_ids() == [first.id]
    # what the evaluation alone took is the task's need from now on (more than its estimate)
    assert room.need(first) == 30 * GiB and room.need(second) == 10 * GiB
    evaluators.close()


def test_a_failure_that_is_not_out_of_memory_or_not_on_a_gpu_is_not_judged_again():
    task, other = _task(1), _task(2)
    for device, reason in (("cuda:0", "forward raised: ValueError"), ("cpu", H200_MESSAGES[0])):
        made: list = []
        script = [Verdict(status=RUNTIME_ERROR, reasons=[reason])]
        evaluators = Evaluators(lambda t, s=script, m=made: ScriptedEvaluator(t, s, m), keep=3)
        evaluators.get(other)
        verdict = crowding.judge(evaluators.get(task), "src", device=device, evaluators=evaluators, task=task)
        assert verdict.attempts == 1 and "crowded_retry" not in verdict.timing
        assert sorted(evaluators.task_ids()) == sorted([task.id, other.id])  # nothing retired
        evaluators.close()


@pytest.mark.timeout(300)
def test_a_candidate_out_of_memory_on_its_own_keeps_its_verdict_after_one_retry():
    """Real evaluations (CPU sides; the GPU rule applied by name): a candidate whose forward always
    raises torch.OutOfMemoryError is judged twice when another task was held, once when alone, and its
    runtime_error stands either way."""
    task, other = _task(1), _task(2)
    evaluators = Evaluators(lambda t: Evaluator(t, _config()), keep=3)
    ahead = Lookahead(evaluators, depth=1)
    try:
        evaluators.get(other)
        ahead.start("next", task, TASK.format(k=1) + SAYS_OUT_OF_MEMORY_IN_A_VALUE_ERROR, [task.id])
        crowded = crowding.judge(evaluators.get(task), TASK.format(k=1) + RAISES_OUT_OF_MEMORY, device="cuda:0",
                                 evaluators=evaluators, task=task, ahead=ahead)
        assert crowded.status == RUNTIME_ERROR and "OutOfMemoryError" in crowded.reasons[0]
        assert crowded.attempts == 2 and crowded.timing["crowded_retry"]["beside"] == 2  # a task and a load
        assert ahead.started() == set() and evaluators.task_ids() == [task.id]
        alone = crowding.judge(evaluators.get(task), TASK.format(k=1) + RAISES_OUT_OF_MEMORY, device="cuda:0",
                               evaluators=evaluators, task=task, ahead=ahead)
        assert alone.status == RUNTIME_ERROR and alone.attempts == 1 and "crowded_retry" not in alone.timing
    finally:
        ahead.close()
        evaluators.close()
