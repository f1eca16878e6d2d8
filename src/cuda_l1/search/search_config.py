"""Settings of the optimisation loop. Every field has a one-line help; defaults suit a GPU host."""

from __future__ import annotations

from dataclasses import dataclass

from cuda_l1.contrastive import SamplerConfig
from cuda_l1.errors import UserError
from cuda_l1.settings import setting
from cuda_l1.strategies import STRATEGIES, baseline_names

RUN_NAME = "optimize"  # the run inside the history store that `optimize` creates and resumes
SOLUTIONS_NAME = "solutions.jsonl"  # best verified candidate per task, in the format `cuda-l1 audit` reads
EVENTS_NAME = "events.jsonl"  # one JSON line per thing that happened, appended as it happens


@dataclass
class SearchConfig:
    """How the loop spends its budget."""

    budget: int = setting(8, "LLM completions per task in this run (each is one candidate, usable or not)")
    concurrency: int = setting(8, "attempts (LLM request + evaluation) in flight across all tasks")
    per_task: int = setting(1, "attempts in flight per task; 1 lets every prompt learn from every earlier result")
    strategies: tuple[str, ...] = setting(factory=lambda: tuple(baseline_names()), help="offline starting points")
    sampler: SamplerConfig = setting(factory=SamplerConfig, help="exemplars per prompt (N=2) and their draw")
    max_failures: int = setting(3, "recent failures of the task shown in each prompt")
    seed: int = setting(0, "seed of the exemplar draws (per task), so a rerun shows the same exemplars")
    max_request_failures: int = setting(5, "consecutive failed LLM requests after which the run stops (endpoint down)")

    def __post_init__(self) -> None:
        problems = []
        if self.budget < 0:
            problems.append(f"budget must be 0 or more (got {self.budget})")
        if self.concurrency < 1:
            problems.append(f"concurrency must be at least 1 (got {self.concurrency})")
        if self.per_task < 1:
            problems.append(f"per_task must be at least 1 (got {self.per_task})")
        if self.max_failures < 0:
            problems.append(f"max_failures must be 0 or more (got {self.max_failures})")
        if self.max_request_failures < 1:
            problems.append(f"max_request_failures must be at least 1 (got {self.max_request_failures})")
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown:
            problems.append(f"unknown strateg{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)} "
                            f"(known: {', '.join(STRATEGIES)})")
        if problems:
            raise UserError("bad optimize settings: " + "; ".join(problems) + ".")
        self.strategies = tuple(self.strategies)
