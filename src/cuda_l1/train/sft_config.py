"""Config of stage 1, SFT data augmentation: `cuda-l1 train sft --config FILE`.

    model.path = "/models/Qwen2.5-Coder-7B-Instruct"
    output_dir = "runs/sft"
    [tasks]    source = "builtin"; levels = [1, 2, 3]
    [data]     endpoints = "endpoints.toml"; attempts_per_task = 20
    [eval]     device = "cuda"
    [lora]     enabled = true
    [trainer]  learning_rate = 1e-5; num_train_epochs = 2     # any trl.SFTConfig field
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cuda_l1.errors import UserError
from cuda_l1.train.config import EvalSection, LoraSection, ModelSection, TaskSection

PHASES = ("all", "data", "train")


@dataclass
class SFTDataSection:
    """How training data is sampled from LLM endpoints and kept."""

    endpoints: str = ""  # endpoint list file (TOML/JSON, the format of `cuda-l1 optimize --endpoints`)
    attempts_per_task: int = 20  # completions per task and endpoint at most (the paper's 20 tries)
    successes_per_task: int = 1  # stop a (task, endpoint) pair after this many verified candidates (0: use every attempt)
    batch_size: int = 4  # completions asked for in one request (the `n` of the request)
    gpu_name: str = ""  # GPU named in the prompts ("" = "an NVIDIA CUDA GPU")
    completion_format: str = "full"  # full: the model's own answer; canonical: its analysis + the verified code only
    concurrency: int = 16  # (task, endpoint) requests in flight at once


@dataclass
class SFTStageConfig:
    """Stage 1: sample candidates from LLMs, keep the verified ones, fine-tune on them."""

    model: ModelSection = field(default_factory=ModelSection)  # the model to fine-tune
    output_dir: str = "runs/sft"  # data/, trainer/ (checkpoints, TensorBoard) and final/ go here
    store: str = ""  # history DB ("" = OUTPUT_DIR/history.db); share it across stages so exemplars accumulate
    phases: str = "all"  # all (sample then train), data (sample only) or train (train on existing data only)
    datasets: list[str] = field(default_factory=list)  # extra training data: .jsonl files or save_to_disk directories
    seed: int = 0  # seed of sampling order and training
    resume_from_checkpoint: str = ""  # "" (fresh), "latest" (newest checkpoint in trainer/), or a checkpoint path
    tasks: TaskSection = field(default_factory=TaskSection)  # which tasks to sample for
    data: SFTDataSection = field(default_factory=SFTDataSection)  # sampling settings
    eval: EvalSection = field(default_factory=EvalSection)  # the evaluator that verifies samples
    lora: LoraSection = field(default_factory=LoraSection)  # LoRA (PEFT) instead of full fine-tuning
    trainer: dict = field(default_factory=dict)  # trl.SFTConfig fields (learning_rate, max_steps, bf16, ...)

    def validate(self) -> None:
        if self.phases not in PHASES:
            raise UserError(f"phases is one of {', '.join(PHASES)} (got {self.phases!r}).")
        if self.phases in ("all", "data") and not self.data.endpoints:
            raise UserError("[data] endpoints is empty: the data phase samples from LLM endpoints "
                            "(a TOML/JSON endpoint list).")
        if self.data.attempts_per_task < 1 or self.data.batch_size < 1 or self.data.concurrency < 1:
            raise UserError("[data] attempts_per_task, batch_size and concurrency must be at least 1.")
        if self.data.successes_per_task < 0:
            raise UserError("[data] successes_per_task must be 0 (no limit) or more.")
        if self.data.completion_format not in ("full", "canonical"):
            raise UserError(f"[data] completion_format is full or canonical (got {self.data.completion_format!r}).")
        if "output_dir" in self.trainer:
            raise UserError("[trainer] output_dir is set by the stage (OUTPUT_DIR/trainer); set output_dir instead.")
