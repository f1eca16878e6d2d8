"""What an offline strategy is: a named way to turn any task into a candidate without an LLM.

A candidate is a complete, self-contained module: the task's reference source followed by a
`class ModelNew` that the evaluator builds exactly like `Model` (same constructor arguments, same RNG
seed). Every strategy here subclasses the reference `Model`, so parameters are created in the same
order and `state_dict` keys match; only `forward` changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuda_l1.tasks.task import Task

# Marks where the reference ends and the generated code begins, so a reader of a stored candidate
# (or of a report) sees at once which part is the task and which part the strategy wrote.
BANNER = "# ---- cuda-l1 offline strategy: {name} ----"


def is_cuda_device(device: str) -> bool:
    """'cuda', 'cuda:1' or a CUDA device name such as 'NVIDIA H200' (what verdicts record)."""
    text = device.strip().lower()
    return text.startswith("cuda") or "nvidia" in text


@dataclass(frozen=True)
class Strategy:
    """One offline candidate generator (see `cuda_l1.strategies.STRATEGIES`)."""

    name: str  # registry key; also the `origin` recorded with each of its verdicts
    description: str  # one line for listings and reports
    code: str  # the Python appended after the reference source; it defines ModelNew
    cuda_only: bool = False  # True when the strategy has no meaning without a CUDA device
    off_cuda_note: str = ""  # why it is skipped without CUDA; "{device}" is replaced by the device asked about

    def applies(self, device: str) -> tuple[bool, str]:
        """Whether this strategy makes sense on `device`, and a note saying why not when it does not."""
        if self.cuda_only and not is_cuda_device(device):
            note = self.off_cuda_note or f"{self.name} needs a CUDA device; skipped on {{device}}."
            return False, note.replace("{device}", device or "this device")
        return True, ""

    def generate(self, task: Task) -> str:
        """The candidate source for `task`: its reference source, then this strategy's ModelNew."""
        reference = task.source.rstrip() + "\n"
        return f"{reference}\n\n{BANNER.format(name=self.name)}\n{self.code.strip()}\n"
