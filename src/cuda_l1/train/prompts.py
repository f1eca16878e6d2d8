"""Stage 3's prompts: built on the fly from the history store, identical on every rank.

A GRPO dataset row names a task; the prompt the policy sees is built only when the row is sampled,
from what the store knows at that moment: N exemplars (earlier correct kernels with their measured
speedups, drawn by the contrastive sampler) and optionally the latest failures. As training writes
verdicts back, later prompts show faster exemplars.

Every copy of a prompt in a GRPO group must be the same text, and the copies are spread over ranks.
Choice: rank 0 builds the prompts of the whole generation batch and broadcasts them.
- Rank 0 is the store's only writer and the only process that can read it: other ranks may run on
  other hosts, and SQLite on a shared filesystem is not safe to share. Even on one host, a rank that
  read the store itself could see a different snapshot than rank 0 (a verdict landing in between).
- The build is still a pure function of (seed, step, row, store contents): its RNG is seeded from
  those, never from process state. So a resumed run rebuilds the same prompts from the same store,
  and two builders on the same store agree (tested on CPU as two ranks in one process).
The alternative (every rank builds from seed + step) would need every rank to see the same store
snapshot, which only a shared, synchronised database gives.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from cuda_l1.contrastive import SamplerConfig, build_prompt, sample_exemplars
from cuda_l1.settings import setting
from cuda_l1.store import Store
from cuda_l1.tasks import Task
from cuda_l1.train.distributed import Collective


@dataclass
class PromptSection:
    """How contrastive prompts are built."""

    n_exemplars: int = setting(2, "earlier correct kernels shown per prompt, with their speedups (the paper's N = 2)")
    temperature: float = setting(1.0, "softmax temperature over speedup buckets (low: favour the fastest bucket)")
    bucket_edges: list[float] = setting(factory=lambda: [0.8, 1.0, 1.2, 1.5, 2.0, 3.0, 5.0], help="bucket bounds")
    score: str = setting("log", "bucket score: log (mean log-speedup) or mean")
    failures: int = setting(0, "latest failures of the task shown in the prompt (0: none)")
    gpu_name: str = setting("", 'GPU named in the prompt ("" = "an NVIDIA CUDA GPU")')
    rows_per_task: int = setting(64, "dataset rows per task (a row is re-prompted each time the trainer samples it)")

    def sampler(self) -> SamplerConfig:
        return SamplerConfig(n_exemplars=self.n_exemplars, temperature=self.temperature,
                             bucket_edges=tuple(self.bucket_edges), score=self.score)


def stable_seed(*parts) -> int:
    """A seed from values, the same in every process (Python's hash() of a str is salted per process)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).hexdigest()
    return int(digest[:16], 16)


def base_prompt(task: Task, section: PromptSection) -> list[dict]:
    """The zero-exemplar prompt: what a dataset row holds before the store has anything to show."""
    return build_prompt(task.source, [], [], section.gpu_name, task_name=task.name)


class ContrastivePromptBuilder:
    """Builds (and records) the contrastive prompt of one dataset row at one training step."""

    def __init__(self, store: Store, tasks: dict[str, Task], section: PromptSection, seed: int,
                 run_id: int | None = None, device: str | None = None, record: bool = True,
                 config_key: str | None = None):
        self.store = store
        self.tasks = tasks  # task id -> Task
        self.section = section
        self.sampler = section.sampler()
        self.seed = seed
        self.run_id = run_id
        self.device = device  # verdict device whose speedups are shown (speedups on other GPUs do not compare)
        self.record = record  # write each prompt to the store (completions link to it)
        self.config_key = config_key  # evaluation settings whose speedups are shown (None: any)

    def build(self, task_id: str, row: int, step: int) -> dict:
        task = self.tasks[task_id]
        rng = random.Random(stable_seed(self.seed, step, row, task_id))
        candidates = self.store.correct_candidates(task_id, device=self.device, config_key=self.config_key)
        exemplars = sample_exemplars(candidates, self.sampler, rng)
        failures = []
        if self.section.failures:
            failures = self.store.recent_failures(task_id, self.section.failures, self.device)
        messages = build_prompt(task.source, exemplars, failures, self.section.gpu_name, task_name=task.name)
        exemplar_ids = [e.candidate_id for e in exemplars]
        prompt_id = None
        if self.record:
            prompt_id = self.store.record_prompt(task_id, messages, exemplar_ids, run_id=self.run_id)
        return {"messages": messages, "exemplar_ids": exemplar_ids, "prompt_id": prompt_id,
                "exemplar_speedups": [e.speedup for e in exemplars]}


def share_prompts(collective: Collective, builder: ContrastivePromptBuilder | None, inputs: list[dict],
                  step: int) -> list[dict]:
    """Give each input row its contrastive prompt for `step`: rank 0 builds, every rank receives.

    `inputs` are this rank's rows (dicts with "row" and "task_id"); the result is new dicts with
    "prompt", "prompt_id" and "exemplar_ids" set. Collective: every rank must call it at the same step.
    """
    requests = [(int(x["row"]), x["task_id"]) for x in inputs]
    per_rank = collective.all_gather(requests)
    table = None
    if collective.is_main:
        if builder is None:
            raise RuntimeError("rank 0 needs a prompt builder")
        unique = sorted({request for rank_requests in per_rank for request in rank_requests})
        table = {row: builder.build(task_id, row, step) for row, task_id in unique}
    table = collective.broadcast(table)
    return [{**x, "prompt": table[int(x["row"])]["messages"], "prompt_id": table[int(x["row"])]["prompt_id"],
             "exemplar_ids": table[int(x["row"])]["exemplar_ids"]} for x in inputs]
