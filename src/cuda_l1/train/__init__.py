"""Training: the paper's three stages, runnable on any Hugging Face causal LM loaded by path.

    stage 1  sft_data.py + sft_trainer.py        sample from LLM endpoints, keep verified kernels, SFT
    stage 2  self_improve_trainer.py             generate, keep successes (0/1 reward), retrain; R rounds
    stage 3  rl_trainer.py + prompts.py + reward.py
                                                 GRPO on contrastive prompts built from the history store,
                                                 rewarded by the evaluator, every verdict written back
    shared   attempts.py (completion -> verdict -> store), config_files.py (TOML/JSON stage files and
             their shared sections), modeling.py,
             dataset.py, generation.py, metrics.py, distributed.py (collectives between ranks),
             launch.py (world size, single-process drivers), task_selection.py, eval_pool.py,
             outputs.py (output folder, store path), trainer_args.py ([trainer] -> TRL config),
             preflight.py (what a command checks before it starts a stage)
    tests    tiny.py: a tiny random Llama with an in-process BPE tokenizer, saved like a real checkpoint

Each stage has a `<name>_config.py` (a dataclass, a help line in each field's metadata) and a runner; the CLI is
`cuda-l1 train sft|self-improve|rl --config FILE`. Heavy libraries (transformers, trl, peft, datasets)
are imported only when a stage runs; install them with `pip install 'cuda-l1[train]'`.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "SFTStageConfig": "cuda_l1.train.sft_config",
    "SelfImproveConfig": "cuda_l1.train.self_improve_config",
    "RLStageConfig": "cuda_l1.train.rl_config",
    "RewardConfig": "cuda_l1.train.reward",
    "shape_reward": "cuda_l1.train.reward",
    "load_config": "cuda_l1.train.config_files",
    "run_sft": "cuda_l1.train.sft_trainer",
    "run_self_improve": "cuda_l1.train.self_improve_trainer",
    "run_rl": "cuda_l1.train.rl_trainer",
    "build_tiny_model": "cuda_l1.train.tiny",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
