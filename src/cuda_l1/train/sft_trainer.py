"""Stage 1, training: fine-tune the model on verified samples with TRL's SFTTrainer (full or LoRA).

`finetune` is also what stage 2 calls after each round. The loss is on the completion only (TRL's
default for prompt-completion data): the model learns to answer the prompt, not to reproduce it.

Outputs in OUTPUT_DIR: trainer/ (checkpoint-N folders, TensorBoard events under trainer/runs),
final/ (the fine-tuned model, LoRA merged unless [lora] merge = false), adapter/ (LoRA only),
train_summary.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from cuda_l1.errors import UserError
from cuda_l1.train.config_files import LoraSection, ModelSection, to_dict
from cuda_l1.train.dataset import load_rows, training_dataset
from cuda_l1.train.modeling import (
    check_model_path,
    free_accelerator_memory,
    load_model,
    load_tokenizer,
    lora_config,
    save_trained,
)
from cuda_l1.train.sft_config import SFTStageConfig
from cuda_l1.train.trainer_args import build

# Our defaults for trl.SFTConfig; any [trainer] key overrides them.
SFT_DEFAULTS = {
    "report_to": ["tensorboard"],
    "logging_steps": 1,
    "save_strategy": "steps",
    "save_steps": 200,
    "max_length": 8192,  # prompt (reference + rules) + answer (analysis + module) often exceed TRL's 1024
    "num_train_epochs": 1,
}


def latest_checkpoint(trainer_dir: Path) -> Path | None:
    found = [p for p in trainer_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return max(found, key=lambda p: int(p.name.split("-")[-1])) if found else None


def resolve_resume(value: str, trainer_dir: Path) -> str | None:
    """'' -> fresh; 'latest' -> newest checkpoint in trainer_dir (fresh if none); otherwise that path."""
    if not value:
        return None
    if value == "latest":
        found = latest_checkpoint(trainer_dir)
        return str(found) if found else None
    if not Path(value).is_dir():
        raise UserError(f"resume_from_checkpoint: {value} is not a checkpoint directory.")
    return value


def sft_args(trainer: dict, output_dir: Path, seed: int):
    """trl.SFTConfig from our defaults and the [trainer] table (UserError on a field TRL does not know)."""
    from trl import SFTConfig

    return build(SFTConfig, trainer, SFT_DEFAULTS, {"output_dir": str(output_dir), "seed": trainer.get("seed", seed)})


def finetune(model: ModelSection, lora: LoraSection, rows: list[dict], output_dir: str | Path,
             trainer: dict, seed: int = 0, resume: str = "") -> dict:
    """SFT on prompt/completion rows; returns a summary with the final model directory."""
    from trl import SFTTrainer

    if not rows:
        raise UserError("no training rows: the dataset is empty (no verified samples yet).")
    out = Path(output_dir)
    path = check_model_path(model)
    args = sft_args(trainer, out / "trainer", seed)
    tokenizer = load_tokenizer(path, padding_side="right", trust_remote_code=model.trust_remote_code)
    peft = lora_config(lora)
    policy = load_model(model, path)
    sft = SFTTrainer(model=policy, args=args, train_dataset=training_dataset(rows), processing_class=tokenizer,
                     peft_config=peft)
    checkpoint = resolve_resume(resume, out / "trainer")
    result = sft.train(resume_from_checkpoint=checkpoint)
    final = save_trained(sft, model, lora, tokenizer, out)
    summary = {"final_model": str(final), "global_step": sft.state.global_step,
               "train_loss": result.training_loss, "rows": len(rows), "resumed_from": checkpoint,
               "log_history": sft.state.log_history}
    del sft, policy
    free_accelerator_memory()
    return summary


def training_rows(config: SFTStageConfig) -> list[dict]:
    """The rows to train on: this stage's sampled data plus any configured extra datasets."""
    from cuda_l1.train.dataset import dedupe
    from cuda_l1.train.sft_data import data_paths

    own = data_paths(config.output_dir)["jsonl"]
    sources = [Path(p) for p in config.datasets]
    if own.exists() or not sources:
        sources.insert(0, own)
    rows = []
    for source in sources:
        if not source.exists():
            raise UserError("no such dataset; run the data phase first (phases = 'data' or 'all') or list "
                            "existing data in `datasets`.", path=str(source))
        rows.extend(load_rows(source))
    return dedupe(rows)


def run_sft(config: SFTStageConfig, console: Console | None = None) -> dict:
    """Stage 1 end to end (or one of its phases); returns a summary dict."""
    from cuda_l1.store import Store
    from cuda_l1.train.attempts import Judge
    from cuda_l1.train.eval_pool import open_pool
    from cuda_l1.train.launch import DATA_PHASE, is_main_process, require_single_process
    from cuda_l1.train.outputs import prepare_output, store_path
    from cuda_l1.train.task_selection import register_tasks, select_tasks
    from cuda_l1.train.sft_data import sample_sft_data

    out = Path(config.output_dir)
    if is_main_process():
        prepare_output(out, to_dict(config), "sft")
    summary: dict = {"output_dir": str(out)}
    if config.phases in ("all", "data"):
        require_single_process(DATA_PHASE)
        tasks = select_tasks(config.tasks, config.eval)
        with Store(store_path(config.store, out)) as store:
            register_tasks(store, tasks)
            pool, eval_cfg = open_pool(config.eval)
            try:
                summary["data"] = sample_sft_data(config, tasks, store,
                                                  lambda run_id: Judge(store, pool, eval_cfg, run_id), console)
            finally:
                pool.close()
    if config.phases in ("all", "train"):
        rows = training_rows(config)
        trained = finetune(config.model, config.lora, rows, out, config.trainer, config.seed,
                           config.resume_from_checkpoint)
        summary["train"] = {k: v for k, v in trained.items() if k != "log_history"}
        if is_main_process():
            (out / "train_summary.json").write_text(json.dumps(trained, indent=2, default=str))
    return summary


__all__ = ["SFT_DEFAULTS", "finetune", "latest_checkpoint", "resolve_resume", "run_sft"]
