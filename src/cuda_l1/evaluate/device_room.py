"""Room on the device for a task: whether a worker may prepare another task's reference beside the
ones it holds.

A worker holds the prepared references of its recent tasks (jobs.Evaluators) and prepares the next
candidates' tasks ahead (lookahead.py). On KernelBench's level 1 an elementwise task's input is
6 GiB and its output as large; one such task's evaluation holds about twelve times that on the
device (below), and a worker holding three of them at once left 3 GiB of an H200's 140 free: the
next task's float64 oracle failed, and seven level-1 verdicts were `runtime_error` for it.

So on a GPU a task is prepared ahead only when the device has room for it now, and a task prepared
in its own turn first retires every held reference that no queued job needs until there is room.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Callable, Iterable

from cuda_l1.evaluate.task_marks import GRACE_S, in_worker, running_task_code
from cuda_l1.tasks.deadline import DEFAULT_TASK_TIMEOUT_S

# What one evaluation of a task holds on the device, in multiples of one call's input and output
# bytes. Inputs: a round's values as generated and packed, the two sides' input buffers, and the
# float64 oracle's copy of them (two copies of float32 inputs). Outputs: each side keeps two windows'
# outputs, and the oracle's float64 output is two more. (The oracle's inputs were once counted among
# the outputs, which holds for an elementwise task only: KernelBench's AvgPool2d, a 16 GiB input and a
# small output, was let in beside the next task, and its oracle fell back to the CPU: 157 s.)
INPUT_COPIES = 6
OUTPUT_COPIES = 6
HEADROOM_BYTES = 2 << 30  # the sides' own contexts and the caching allocators' slack


def task_bytes(source: str, timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S) -> int:
    """Device bytes an evaluation of the task with this source is expected to hold (0 when its
    shapes cannot be found on torch's meta device: such a task is not held back). The task's code
    runs within `timeout_s` (EvalConfig.task_timeout_s)."""
    from cuda_l1.tasks.runtime import meta_footprint
    from cuda_l1.tasks.task_failures import TASK_FAILURES, escaped_task_failure, is_task_failure

    try:
        footprint = meta_footprint(source, timeout_s)
    except TASK_FAILURES as exc:  # an estimate only: data-dependent shapes, explicit devices, a task's sys.exit()
        if not is_task_failure(exc) and not escaped_task_failure(exc, in_worker()):
            raise
        return 0
    return INPUT_COPIES * footprint["input_bytes"] + OUTPUT_COPIES * footprint["output_bytes"]


class DeviceRoom:
    """Free memory of one CUDA device against what a task needs (`free` and `need` can be given, for
    tests and other devices)."""

    def __init__(self, device: str, free: Callable[[], int] | None = None,
                 need: Callable[[str], int] | None = None, task_timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S):
        self.device = device
        self._free = free or self._cuda_free
        self._need = need or functools.partial(task_bytes, timeout_s=task_timeout_s)
        self.task_timeout_s = task_timeout_s if task_timeout_s is not None else math.inf
        self._needs: dict[str, int] = {}
        self._seen: dict[str, int] = {}  # task id -> device bytes an evaluation held (remember)
        self._lock = threading.Lock()

    def _cuda_free(self) -> int:
        import torch

        return torch.cuda.mem_get_info(torch.device(self.device))[0]

    def need(self, task) -> int:
        with self._lock:
            known = self._needs.get(task.id)
        if known is None:  # the task's module runs with no lock held: a hanging one holds up no other thread
            with running_task_code(task.id, limit_s=self.task_timeout_s + GRACE_S):  # task_marks.py
                known = self._need(task.source)
        with self._lock:
            self._needs.setdefault(task.id, known)
            return max(self._needs[task.id], self._seen.get(task.id, 0))

    def free(self) -> int:
        return self._free()

    def remember(self, task, used: int) -> None:
        """What an evaluation of `task` was seen to hold, judged alone (crowding.py): its need from
        now on, where that is more than the estimate."""
        with self._lock:
            self._seen[task.id] = max(self._seen.get(task.id, 0), int(used))

    def fits(self, task, held: Iterable[str] = ()) -> bool:
        """Whether `task` may be prepared now beside the `held` tasks (ids): its need and, in reserve,
        the largest that an evaluation of a held task was seen to take (remember)."""
        need = self.need(task)
        with self._lock:
            reserve = max((self._seen.get(i, 0) for i in held if i != task.id), default=0)
        return (need == 0 and reserve == 0) or self._free() >= need + reserve + HEADROOM_BYTES

    def release_cached(self) -> None:
        """Give the parent's cached device blocks back, so that other processes see them free."""
        import torch

        torch.cuda.empty_cache()


def room_for(device: str, task_timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S) -> DeviceRoom | None:
    """The room of a worker's device: none to watch on a CPU, where inputs are host memory that the
    sides' own limits count."""
    return DeviceRoom(device, task_timeout_s=task_timeout_s) if device.startswith("cuda") else None
