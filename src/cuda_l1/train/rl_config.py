"""Config of stage 3, contrastive RL (GRPO): `cuda-l1 train rl --config FILE`."""

from __future__ import annotations

from dataclasses import dataclass

from cuda_l1.errors import UserError
from cuda_l1.settings import setting
from cuda_l1.train.config_files import EvalSection, LoraSection, ModelSection, TaskSection
from cuda_l1.train.prompts import PromptSection
from cuda_l1.train.reward import RewardConfig
from cuda_l1.train.steering import SteerSection

VLLM_MODES = ("off", "colocate", "server")


@dataclass
class RLStageConfig:
    """Stage 3: GRPO on contrastive prompts, rewarded by the evaluator, every verdict written back."""

    model: ModelSection = setting(factory=ModelSection, help="the policy (e.g. stage 2's final checkpoint)")
    output_dir: str = setting("runs/rl", "trainer/ (checkpoints, TensorBoard), final/, rl_metrics.jsonl go here")
    store: str = setting("", 'history store ("" = OUTPUT_DIR/history.sqlite, or a history.db left there by '
                         "an older run); the exemplars come from it and verdicts go to it")
    seed: int = setting(0, "seed of prompt building (shared by all ranks) and training")
    resume_from_checkpoint: str = setting("", '"" (fresh), "latest" (newest checkpoint in '
                                          "trainer/), or a checkpoint path")
    seed_strategies: list[str] = setting(factory=lambda: ["eager"], help="offline strategies judged first (exemplars)")
    vllm: str = setting("off", "generation: off (transformers generate), colocate "
                        "(vLLM on the training GPUs) or server")
    tasks: TaskSection = setting(factory=TaskSection, help="which tasks to train on")
    prompt: PromptSection = setting(factory=PromptSection, help="contrastive prompt settings")
    reward: RewardConfig = setting(factory=RewardConfig, help="verdict -> reward shaping")
    eval: EvalSection = setting(factory=EvalSection, help="the evaluator (the reward); keep it off the training GPUs")
    lora: LoraSection = setting(factory=LoraSection, help="LoRA (PEFT) instead of full fine-tuning")
    steer: SteerSection = setting(factory=SteerSection, help="smoke runs only: pull sampling towards given answers")
    trainer: dict = setting(factory=dict, help="trl.GRPOConfig fields (num_generations, epsilon, beta, max_steps, ...)")

    def validate(self) -> None:
        self.reward.validate()
        self.steer.validate("rl")
        if self.steer.enabled and self.vllm != "off":
            raise UserError("[steer] works with transformers generation only (vllm = 'off').")
        self.prompt.sampler()  # raises UserError on a bad sampler setting
        if self.vllm not in VLLM_MODES:
            raise UserError(f"vllm is one of {', '.join(VLLM_MODES)} (got {self.vllm!r}).")
        if self.prompt.rows_per_task < 1:
            raise UserError("[prompt] rows_per_task must be at least 1.")
        if self.prompt.failures < 0:
            raise UserError("[prompt] failures must be 0 or more.")
        for key in ("output_dir", "use_vllm", "vllm_mode"):
            if key in self.trainer:
                raise UserError(f"[trainer] {key} is set by the stage (output_dir / vllm keys at the top level).")
