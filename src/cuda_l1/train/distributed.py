"""Object collectives between training processes (prompts and rewards are computed on rank 0).

`Collective` is the single-process case; `AccelerateCollective` works in any run started by
`accelerate launch` or `torchrun` (it uses the process group the trainer uses).
"""

from __future__ import annotations

from typing import Any


class Collective:
    """Object collectives between training processes; this base class is the single-process case."""

    rank = 0
    world_size = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather(self, obj: Any) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        return [obj]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        return obj


class AccelerateCollective(Collective):
    """Collectives over the processes `accelerate launch` (or torchrun) started."""

    def __init__(self):
        from accelerate import PartialState

        state = PartialState()
        self.rank = state.process_index
        self.world_size = state.num_processes

    def all_gather(self, obj: Any) -> list:
        if self.world_size == 1:
            return [obj]
        from accelerate.utils import gather_object

        return gather_object([obj])

    def broadcast(self, obj: Any) -> Any:
        if self.world_size == 1:
            return obj
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([obj], from_process=0)[0]
