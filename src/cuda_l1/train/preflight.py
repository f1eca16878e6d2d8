"""Checks a stage passes when its command starts, before hours of sampling: the TRL config it will
train with builds from its `[trainer]` table, and a driver that owns the store and the pool runs in
one process.

It sits above the stage modules (it asks each one for its TRL config), so `trainer_args` below them
stays a plain translator that knows no stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cuda_l1.train.launch import DATA_PHASE, SELF_IMPROVE_DRIVER, require_single_process


def check_stage(stage: str, config) -> Any:
    """Build the TRL config a stage will train with (UserError if it cannot be built); returns it.

    Building it sets up the process group of a distributed launch, as the stage itself does; so the
    drivers that must run in one process (stage 2, stage 1's data phase) are refused here first.
    """
    if stage == "rl":
        from cuda_l1.train.rl_trainer import grpo_args

        return grpo_args(config, Path(config.output_dir) / "trainer")
    from cuda_l1.train.sft_trainer import sft_args

    if stage == "self-improve":
        require_single_process(SELF_IMPROVE_DRIVER)
    elif config.phases in ("all", "data"):
        require_single_process(DATA_PHASE)
    if stage == "sft" and config.phases == "data":
        return None  # nothing is trained
    where = Path(config.output_dir) / ("trainer" if stage == "sft" else "round-1/trainer")
    return sft_args(config.trainer, where, config.seed)
