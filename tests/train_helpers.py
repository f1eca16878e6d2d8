"""Shared pieces of the training tests: answers with known verdicts and config files built from the
examples.

The tiny model's weights are random, so on its own it never writes a parseable module. The shipped
tiny examples steer its sampling ([steer], src/cuda_l1/train/steering.py) towards the answers in
examples/train/tiny/answers*.jsonl; the tests run those examples as they are.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from cuda_l1.strategies import STRATEGIES
from cuda_l1.tasks import Task

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "train"

# Parses, but cannot be built with the task's constructor arguments: runtime_error.
BROKEN_ANSWER = '''The reference is simple; a thin wrapper will do.

```python
import torch


class ModelNew(torch.nn.Module):
    def forward(self, *args):
        return undefined_helper(*args)
```'''

# Not a module at all: parse_error.
GARBAGE_ANSWER = "I would fuse the kernels, but I will not write any code today."


def eager_code(task: Task) -> str:
    return STRATEGIES["eager"].generate(task)


def correct_answer(task: Task) -> str:
    """A verified-correct answer: the reference unchanged (speedup about 1.0)."""
    return f"The reference is already close to optimal here.\n\n```python\n{eager_code(task).rstrip()}\n```"


def hack_answer(task: Task) -> str:
    """Correct outputs, but it overwrites its input once done: the evaluator must refuse it."""
    return f"Freeing the input early saves memory.\n\n```python\n{hack_code(task)}```"


def hack_code(task: Task) -> str:
    """The reference (as ModelNew), zeroing its first input after computing the output."""
    return eager_code(task).rstrip() + (
        "\n\n    def forward(self, *args):\n        out = super().forward(*args)\n        args[0].zero_()\n"
        "        return out\n")


def example_config(name: str, **changes) -> dict:
    """An example config (examples/train/tiny/NAME.toml) as a dict, with top-level or dotted-key changes."""
    data = tomllib.loads((EXAMPLES / "tiny" / f"{name}.toml").read_text())
    for key, value in changes.items():
        node = data
        parts = key.split("__")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return data


def write_config(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data, indent=2))
    return path
