"""The `[eval]` table -> the evaluation pool a stage submits candidates to, and the settings it judges with.

A stage may evaluate on one device (local or Ray workers) or on a list of local GPUs, e.g. the ones
training leaves free; either way it sees one `EvalPool`.
"""

from __future__ import annotations

from concurrent.futures import Future

from cuda_l1.devices import Device, device_key, parse_devices
from cuda_l1.errors import UserError
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.jobs import EvalJob, EvalPool
from cuda_l1.evaluate.pool import make_pool
from cuda_l1.train.config_files import EvalSection


def _devices(section: EvalSection) -> list[Device]:
    return parse_devices(section.device, section.cluster, what="[eval] device")


def local_device_label(section: EvalSection) -> str | None:
    """The device name this stage's verdicts will carry, where this host can tell (local GPUs of one
    kind, or the CPU); None where it cannot (a Ray cluster's GPUs): the judge learns it from the first
    verdict. Never an earlier run's label: resumed on another GPU, a run looked up (and scored with,
    and showed in its prompts) the old GPU's verdicts."""
    if section.cluster != "local":
        return None
    names = {device_key(d) for d in _devices(section)}
    return names.pop() if len(names) == 1 else None


def eval_config(section: EvalSection, rewards_relative: bool = False) -> EvalConfig:
    """`rewards_relative`: a stage whose candidates' rewards are compared within a group (GRPO), where
    one candidate spoiling another's verdict would pay; nothing is loaded ahead there unless the
    section says so (docs/isolation.md: a loading side can reach a judged side's outputs)."""
    from cuda_l1.evaluate.tolerance import ToleranceConfig

    if section.tolerance not in ("oracle", "kernelbench"):
        raise UserError(f"[eval] tolerance is 'oracle' or 'kernelbench' (got {section.tolerance!r}).")
    timing = TimingConfig.quick() if section.quick_timing else TimingConfig()
    if section.lookahead < -1:
        raise UserError(f"[eval] lookahead is -1 (the stage's default) or 0-8 (got {section.lookahead}).")
    lookahead = section.lookahead if section.lookahead >= 0 else 0 if rewards_relative else None
    return EvalConfig(device=str(_devices(section)[0]), tolerance=ToleranceConfig(mode=section.tolerance),
                      timing=timing, correctness_trials=section.correctness_trials, lookahead=lookahead)


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


def open_pool(section: EvalSection, rewards_relative: bool = False) -> tuple[EvalPool, EvalConfig]:
    """The evaluation pool a stage submits candidates to, and the settings it judges with
    (`rewards_relative`: see eval_config)."""
    config = eval_config(section, rewards_relative)
    devices = _devices(section)
    workers = section.workers or None
    if len(devices) == 1:
        return make_pool(section.cluster, device=str(devices[0]), config=config, workers=workers), config
    if section.cluster != "local":
        raise UserError("[eval] a device list needs cluster = 'local'; a Ray cluster places workers itself.")
    return DevicePools([make_pool("local", device=str(d), config=config, workers=1) for d in devices]), config
