"""Stage 3: contrastive RL with TRL's GRPOTrainer.

    seed the store      offline strategies (eager, torch.compile, ...) judged once, so exemplars exist
    each generation     rank 0 builds every row's contrastive prompt from the store (prompts.py),
                        the policy samples `num_generations` answers per prompt,
                        rank 0 judges them all through the evaluation pool and writes every
                        verdict to the store (reward.py), rewards go back to their ranks,
                        GRPO updates the policy with its clipped objective (epsilon in [trainer]).

TRL logs reward, reward_std, KL (when beta > 0), clip ratios, entropy and completion lengths; the
reward function adds cuda_l1/* (parse, compile, correct and rejected rates, mean and best speedup),
all in TensorBoard format under OUTPUT_DIR/trainer/runs; rank 0 also appends them to rl_metrics.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cuda_l1.contrastive.prompt import fenced
from cuda_l1.errors import UserError
from cuda_l1.strategies import get_strategy
from cuda_l1.train import trainer_args
from cuda_l1.train.attempts import Attempt, Judge, rates
from cuda_l1.train.config_files import to_dict
from cuda_l1.train.distributed import AccelerateCollective, Collective
from cuda_l1.train.metrics import MetricsLog, read_metrics
from cuda_l1.train.modeling import check_model_path, load_tokenizer, lora_config, model_kwargs, save_trained
from cuda_l1.train.prompts import ContrastivePromptBuilder, base_prompt, share_prompts
from cuda_l1.train.reward import EvaluatorReward
from cuda_l1.train.rl_config import RLStageConfig
from cuda_l1.train.steering import steering_kwargs
from cuda_l1.train.sft_trainer import resolve_resume

RUN_NAME = "train-rl"

# Our defaults for trl.GRPOConfig; any [trainer] key overrides them.
GRPO_DEFAULTS = {
    "report_to": ["tensorboard"],
    "logging_steps": 1,
    "save_strategy": "steps",
    "save_steps": 50,
    "num_generations": 8,  # answers per prompt: the group GRPO normalises rewards in
    "max_completion_length": 4096,  # analysis + a module with inline CUDA
    "loss_type": "grpo",  # the paper's objective: GRPO, token losses averaged per sequence
    "epsilon": 0.2,  # ratio clip [1 - epsilon, 1 + epsilon] (set epsilon_high for an asymmetric clip)
}


def grpo_args(config: RLStageConfig, output_dir: Path, generation: dict | None = None):
    """trl.GRPOConfig from our defaults, the [trainer] table, the stage's vllm setting and extra
    `generation` keyword arguments (steering)."""
    from trl import GRPOConfig

    fixed = {"output_dir": str(output_dir), "seed": config.trainer.get("seed", config.seed),
             "model_init_kwargs": {**model_kwargs(config.model), **config.trainer.get("model_init_kwargs", {})}}
    if generation:
        fixed["generation_kwargs"] = {**config.trainer.get("generation_kwargs", {}), **generation}
    if config.vllm != "off":
        if not trainer_args.vllm_installed():
            raise UserError(f"vllm = '{config.vllm}' needs vllm installed (pip install 'cuda-l1[vllm]' on a GPU host); "
                            "set vllm = 'off' to generate with transformers.")
        fixed.update(use_vllm=True, vllm_mode=config.vllm)
    return trainer_args.build(GRPOConfig, config.trainer, GRPO_DEFAULTS, fixed)


def contrastive_trainer_class():
    """GRPOTrainer whose prompts are rebuilt from the store right before each generation."""
    from trl import GRPOTrainer

    class ContrastiveGRPOTrainer(GRPOTrainer):
        def __init__(self, *args, prompt_hook=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.prompt_hook = prompt_hook  # (rows, global_step) -> rows with "prompt" filled in

        def _generate_and_score_completions(self, inputs):
            if self.prompt_hook is not None:
                inputs = self.prompt_hook(inputs, self.state.global_step)
            return super()._generate_and_score_completions(inputs)

    return ContrastiveGRPOTrainer


def seed_store(judge: Judge, tasks: list, strategies: list[str], device: str, console: Console) -> dict:
    """Judge the offline strategies' candidates for every task (already judged ones are not re-run)."""
    attempts = []
    for name in strategies:
        strategy = get_strategy(name)
        applies, _ = strategy.applies(device)
        if applies:
            attempts += [Attempt(t, fenced(strategy.generate(t)), origin_kind="strategy", strategy=name) for t in tasks]
    if not attempts:
        return {"count": 0}
    with Progress(TextColumn("[bold]seeding the store"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        bar = progress.add_task("seed", total=len(attempts))
        outcomes = judge.judge(attempts, lambda k: progress.advance(bar, k))
    return rates(outcomes)


def dataset_rows(tasks: list, config: RLStageConfig) -> list[dict]:
    rows = []
    for task in tasks:
        prompt = base_prompt(task, config.prompt)
        for _ in range(config.prompt.rows_per_task):
            rows.append({"prompt": prompt, "task_id": task.id, "row": len(rows)})
    return rows


def run_rl(config: RLStageConfig, console: Console | None = None, collective: Collective | None = None) -> dict:
    from datasets import Dataset

    from cuda_l1.store import Store
    from cuda_l1.train.eval_pool import local_device_label, open_pool
    from cuda_l1.train.outputs import prepare_output, store_path
    from cuda_l1.train.task_selection import register_tasks, select_tasks

    console = console or Console(stderr=True)
    out = Path(config.output_dir)
    path = check_model_path(config.model)
    tasks = select_tasks(config.tasks, config.eval)
    by_id = {t.id: t for t in tasks}
    tokenizer = load_tokenizer(path, "left", config.model.trust_remote_code)
    # The trainer's arguments set up the process group (backend, timeout, DeepSpeed); the collective
    # joins that state, so it must come second.
    args = grpo_args(config, out / "trainer", steering_kwargs(config.steer, tokenizer, tasks))
    collective = collective or AccelerateCollective()
    store = pool = metrics = judge = builder = None
    state_path = out / "rl-state.json"
    try:
        if collective.is_main:  # the store, the pool and the prompt builder live on rank 0 only
            prepare_output(out, to_dict(config), "rl")
            state = json.loads(state_path.read_text()) if state_path.exists() else {}
            store = Store(store_path(config.store, out))
            register_tasks(store, tasks)
            pool, eval_cfg = open_pool(config.eval, rewards_relative=True)  # GRPO: advantages within a group
            run_id = store.start_run(RUN_NAME, {"output_dir": str(out.resolve()), "model": path,
                                                "resume": config.resume_from_checkpoint})
            judge = Judge(store, pool, eval_cfg, run_id, device_label=local_device_label(config.eval))
            seeded = seed_store(judge, tasks, config.seed_strategies, eval_cfg.device, console)
            state["device_label"] = judge.device_label
            state_path.write_text(json.dumps(state, indent=2))
            console.print(f"seeded the store: {seeded}")
            builder = ContrastivePromptBuilder(store, by_id, config.prompt, config.seed, run_id, judge.device_label,
                                               config_key=judge.config_key)
            metrics = MetricsLog(out / "rl_metrics.jsonl")
        reward = EvaluatorReward(judge, by_id, config.reward, collective, model_name=path, metrics=metrics)

        def prompt_hook(inputs: list[dict], step: int) -> list[dict]:
            if builder is not None and judge.device_label is not None:
                builder.device = judge.device_label  # learnt from the first verdict, or the device judging now
            return share_prompts(collective, builder, inputs, step)

        trainer = contrastive_trainer_class()(
            model=path, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(dataset_rows(tasks, config)),
            processing_class=tokenizer, peft_config=lora_config(config.lora), prompt_hook=prompt_hook)
        checkpoint = resolve_resume(config.resume_from_checkpoint, out / "trainer")
        result = trainer.train(resume_from_checkpoint=checkpoint)
        final = save_trained(trainer, config.model, config.lora, tokenizer, out)
        summary = {"output_dir": str(out), "final_model": str(final), "global_step": trainer.state.global_step,
                   "train_loss": result.training_loss, "train_runtime_s": (result.metrics or {}).get("train_runtime"),
                   "resumed_from": checkpoint, "reward_calls": reward.calls}
        if collective.is_main:
            steps = read_metrics(out / "rl_metrics.jsonl")
            summary["last_metrics"] = steps[-1] if steps else {}
            summary["verdicts_this_run"] = len(store.run_results(judge.run_id))
            (out / "rl_summary.json").write_text(json.dumps(summary, indent=2, default=str))
        return summary
    finally:
        if pool is not None:
            pool.close()
        if metrics is not None:
            metrics.close()
        if store is not None:
            store.close()
