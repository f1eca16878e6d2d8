"""What the launch looks like: how many processes run this stage, and which of them is the main one.

`accelerate launch` and torchrun start one process per GPU and say so in WORLD_SIZE / RANK. Training
wants that; the drivers that sample and evaluate do not (they own the history store and the
evaluation pool), so they refuse such a launch instead of running once per GPU.
"""

from __future__ import annotations

import os

from cuda_l1.errors import UserError


def world_size() -> int:
    """Processes in this launch (`accelerate launch` / torchrun set WORLD_SIZE); 1 when run directly."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0") or 0) == 0


# The drivers that own the store and the pool, as `require_single_process` names them.
DATA_PHASE = "the data phase (sampling and evaluation)"
SELF_IMPROVE_DRIVER = "self-improve (its `launcher` runs each round's multi-GPU training)"


def require_single_process(what: str) -> None:
    """Sampling and evaluation drivers own the store and the pool: one process, never one per GPU."""
    if world_size() > 1:
        raise UserError(f"{what} runs in a single process (it owns the history store and the evaluation pool, "
                        f"which uses the GPUs itself); this launch has WORLD_SIZE={world_size()}. Run it "
                        "directly, and launch only the training with accelerate (see docs/training.md).")
