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

from dataclasses import dataclass

from cuda_l1.errors import UserError
from cuda_l1.settings import setting
from cuda_l1.train.config_files import EvalSection, LoraSection, ModelSection, TaskSection

PHASES = ("all", "data", "train")


@dataclass
class SFTDataSection:
    """How training data is sampled from LLM endpoints and kept."""

    endpoints: str = setting("", "endpoint list file (TOML/JSON, the format of `cuda-l1 optimize --endpoints`)")
    attempts_per_task: int = setting(20, "completions per task and endpoint at most (the paper's 20 tries)")
    successes_per_task: int = setting(1, "stop a (task, endpoint) pair after this many "
                                      "verified candidates (0: use every attempt)")
    batch_size: int = setting(4, "completions asked for in one request (the `n` of the request)")
    gpu_name: str = setting("", 'GPU named in the prompts ("" = "an NVIDIA CUDA GPU")')
    completion_format: str = setting("full", "full: the model's own answer; canonical: its "
                                     "analysis + the verified code only")
    concurrency: int = setting(16, "(task, endpoint) requests in flight at once")


@dataclass
class SFTStageConfig:
    """Stage 1: sample candidates from LLMs, keep the verified ones, fine-tune on them."""

    model: ModelSection = setting(factory=ModelSection, help="the model to fine-tune")
    output_dir: str = setting("runs/sft", "data/, trainer/ (checkpoints, TensorBoard) and final/ go here")
    store: str = setting("", 'history store ("" = OUTPUT_DIR/history.sqlite, or a history.db left there by '
                         "an older run); share it across stages so exemplars accumulate")
    phases: str = setting("all", "all (sample then train), data (sample only) or train (train on existing data only)")
    datasets: list[str] = setting(factory=list, help="extra training data: .jsonl files or save_to_disk directories")
    seed: int = setting(0, "seed of sampling order and training")
    resume_from_checkpoint: str = setting("", '"" (fresh), "latest" (newest checkpoint in '
                                          "trainer/), or a checkpoint path")
    tasks: TaskSection = setting(factory=TaskSection, help="which tasks to sample for")
    data: SFTDataSection = setting(factory=SFTDataSection, help="sampling settings")
    eval: EvalSection = setting(factory=EvalSection, help="the evaluator that verifies samples")
    lora: LoraSection = setting(factory=LoraSection, help="LoRA (PEFT) instead of full fine-tuning")
    trainer: dict = setting(factory=dict, help="trl.SFTConfig fields (learning_rate, max_steps, bf16, ...)")

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
