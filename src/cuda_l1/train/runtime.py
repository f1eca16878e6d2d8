"""What every stage sets up the same way: tasks, the evaluator pool, the history store, output folders."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Iterable

from cuda_l1.errors import UserError
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.pool import EvalJob, EvalPool, make_pool
from cuda_l1.tasks import Task, load_tasks
from cuda_l1.train.config import EvalSection, TaskSection


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


def select_tasks(section: TaskSection) -> list[Task]:
    """The tasks a stage trains on (UserError when the selection is empty)."""
    tasks = load_tasks(section.source, levels=set(section.levels) or None, ids=section.ids or None)
    if section.limit > 0:
        tasks = tasks[: section.limit]
    if not tasks:
        raise UserError(f"the task selection is empty (source {section.source!r}, levels {section.levels}, "
                        f"ids {section.ids}).")
    return tasks


def _devices(device: str) -> list[str]:
    if device == "auto":
        import torch

        return ["cuda" if torch.cuda.is_available() else "cpu"]
    devices = [d.strip() for d in device.split(",") if d.strip()]
    for d in devices:
        if not (d == "cpu" or d == "cuda" or (d.startswith("cuda:") and d[5:].isdigit())):
            raise UserError(f"[eval] device is cpu, cuda, cuda:N, a comma-separated list of cuda:N, or auto "
                            f"(got {device!r}).")
    return devices or ["cpu"]


def eval_config(section: EvalSection) -> EvalConfig:
    from cuda_l1.evaluate.precision import ToleranceConfig

    if section.tolerance not in ("oracle", "kernelbench"):
        raise UserError(f"[eval] tolerance is 'oracle' or 'kernelbench' (got {section.tolerance!r}).")
    timing = TimingConfig.quick() if section.quick_timing else TimingConfig()
    return EvalConfig(device=_devices(section.device)[0], tolerance=ToleranceConfig(mode=section.tolerance),
                      timing=timing, correctness_trials=section.correctness_trials)


class DevicePools(EvalPool):
    """Several local pools behind one interface: evaluation on chosen GPUs (e.g. the ones training leaves free)."""

    def __init__(self, pools: list[EvalPool]):
        self.pools = pools
        self.workers = [w for p in pools for w in p.workers]
        self._load = [0] * len(pools)

    def submit(self, job: EvalJob) -> Future:
        index = min(range(len(self.pools)), key=lambda i: self._load[i])
        self._load[index] += 1
        future = self.pools[index].submit(job)

        def done(_f, i=index):
            self._load[i] -= 1

        future.add_done_callback(done)
        return future

    def close(self) -> None:
        for pool in self.pools:
            pool.close()


def open_pool(section: EvalSection) -> tuple[EvalPool, EvalConfig]:
    """The evaluation pool a stage submits candidates to, and the settings it judges with."""
    config = eval_config(section)
    devices = _devices(section.device)
    workers = section.workers or None
    if len(devices) == 1:
        return make_pool(section.cluster, device=devices[0], config=config, workers=workers), config
    if section.cluster != "local":
        raise UserError("[eval] a device list needs cluster = 'local'; a Ray cluster places workers itself.")
    return DevicePools([make_pool("local", device=d, config=config, workers=1) for d in devices]), config


def evaluation_key(config: EvalConfig) -> str:
    """The store's config key: verdicts under other settings are not comparable."""
    return config.config_key()


def prepare_output(output_dir: str | Path, config: dict, name: str) -> Path:
    """Create the output folder and write the resolved config next to the results (for reproducibility)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"{name}-config.json").write_text(json.dumps({"written_at": stamp, **config}, indent=2, default=str))
    return out


def store_path(store: str, output_dir: str | Path) -> Path:
    """The history DB: the configured path, else history.db in the output folder."""
    return Path(store) if store else Path(output_dir) / "history.db"


def register_tasks(store, tasks: Iterable[Task]) -> None:
    for task in tasks:
        store.add_task(task)
