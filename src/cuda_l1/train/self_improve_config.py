"""Config of stage 2, self-supervised iterative learning: `cuda-l1 train self-improve --config FILE`."""

from __future__ import annotations

from dataclasses import dataclass

from cuda_l1.errors import UserError
from cuda_l1.settings import setting
from cuda_l1.train.config_files import EvalSection, LoraSection, ModelSection, TaskSection
from cuda_l1.train.generation import BACKENDS
from cuda_l1.train.steering import SteerSection


@dataclass
class GenerationSection:
    """How the current checkpoint is sampled each round."""

    backend: str = setting("hf", "hf (transformers generate), server (OpenAI-compatible "
                           "endpoint) or vllm (offline engine)")
    samples_per_task: int = setting(8, "answers sampled per task per round")
    max_new_tokens: int = setting(4096, "answer length limit")
    temperature: float = setting(1.0, "sampling temperature")
    top_p: float = setting(1.0, "nucleus sampling mass")
    batch_size: int = setting(8, "hf: sequences per generate() call")
    endpoints: str = setting("", "server: endpoint list file, used as is when server_command is empty")
    server_command: str = setting("", "server: command serving the round's checkpoint, e.g."
                                  ' "vllm serve {model} --port {port}"')
    server_port: int = setting(8000, "server: the port substituted for {port}")
    server_timeout_s: float = setting(1800.0, "server: how long to wait for the started server to answer")
    vllm: dict = setting(factory=dict, help="vllm: vllm.LLM keyword arguments (tensor_parallel_size, ...)")
    gpu_name: str = setting("", 'GPU named in the prompts ("" = "an NVIDIA CUDA GPU")')
    extra_completions_file: str = setting("", 'JSONL of {"task": selector, "text": answer} '
                                          "judged with every round's samples")


def off_policy(section: GenerationSection) -> bool:
    """Whether sampling ignores the round's checkpoint: a server used as is, whatever it serves."""
    return section.backend == "server" and not section.server_command and section.samples_per_task > 0


@dataclass
class SelfImproveConfig:
    """Stage 2: generate with the current model, keep only verified answers, fine-tune on them, repeat.

    This is REINFORCE with a 0/1 reward and no baseline, which reduces to SFT on the successes. The
    paper keeps it that way on purpose: at this stage most samples fail, and a learned or averaged
    baseline would be estimated from a handful of noisy successes.
    """

    model: ModelSection = setting(factory=ModelSection, help="the starting checkpoint (e.g. stage 1's final/)")
    output_dir: str = setting("runs/self-improve", "round-N/ folders, metrics.jsonl, "
                              "tensorboard/ and state.json go here")
    store: str = setting("", 'history store ("" = OUTPUT_DIR/history.sqlite, or a '
                         "history.db left there by an older run)")
    rounds: int = setting(3, "generate -> evaluate -> fine-tune rounds")
    accumulate: bool = setting(False, "train on the successes of every round so far "
                               "(False: this round's only, on-policy)")
    allow_off_policy: bool = setting(False, "run although the rounds cannot sample the "
                                     "model they train (a fixed server)")
    seed: int = setting(0, "seed of sampling and training (round r uses seed + r)")
    launcher: str = setting("", "runs each round's training, e.g. \"accelerate launch "
                            '--config_file z3.yaml" ("": in-process)')
    tasks: TaskSection = setting(factory=TaskSection, help="which tasks to sample for")
    generation: GenerationSection = setting(factory=GenerationSection, help="sampling settings")
    eval: EvalSection = setting(factory=EvalSection, help="the evaluator (the 0/1 reward)")
    lora: LoraSection = setting(factory=LoraSection, help="LoRA (PEFT) instead of full fine-tuning")
    steer: SteerSection = setting(factory=SteerSection, help="smoke runs only: pull sampling towards given answers")
    trainer: dict = setting(factory=dict, help="trl.SFTConfig fields for each round's fine-tuning")

    def validate(self) -> None:
        if self.rounds < 1:
            raise UserError(f"rounds must be at least 1 (got {self.rounds}).")
        g = self.generation
        if g.backend not in BACKENDS:
            raise UserError(f"[generation] backend is one of {', '.join(BACKENDS)} (got {g.backend!r}).")
        if g.samples_per_task < 0 or g.max_new_tokens < 1 or g.batch_size < 1:
            raise UserError("[generation] samples_per_task must be 0 or more; max_new_tokens and batch_size at least 1.")
        if g.backend == "server" and not (g.server_command or g.endpoints):
            raise UserError("[generation] backend 'server' needs server_command or endpoints.")
        if off_policy(g) and not self.allow_off_policy:
            raise UserError(
                f"[generation] backend 'server' without server_command samples the endpoints of {g.endpoints} "
                "in every round, never the checkpoint this stage has just trained, so the rounds are not "
                "on-policy (self-improvement trains the model on its own successes). Set server_command to "
                "serve each round's checkpoint (e.g. \"vllm serve {model} --port {port}\"), use backend 'hf' or "
                "'vllm', or set allow_off_policy = true to train on that server's successes anyway.")
        if "output_dir" in self.trainer:
            raise UserError("[trainer] output_dir is set by the stage (OUTPUT_DIR/round-N/trainer).")
        self.steer.validate("self-improve")
        if self.steer.enabled and g.backend != "hf":
            raise UserError("[steer] works with [generation] backend 'hf' only.")
