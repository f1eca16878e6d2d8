"""Shared pieces of the training tests: answers with known verdicts, config files built from the
examples, and a way to make a random-weight model write a chosen answer.

The tiny model's weights are random, so on its own it never writes a parseable module. Where a test
needs the policy to produce real candidates (RL), sampling is steered with transformers'
`sequence_bias` (passed through TRL's `generation_kwargs`): every n-gram of a target answer gets a
large logit bonus. Where an n-gram's context occurs twice in the answer, both continuations are
boosted, so samples are variations of the answer (some correct, some not), which is what GRPO needs.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from cuda_l1.strategies import STRATEGIES
from cuda_l1.tasks import Task

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "train"

# A correct ModelNew for the built-in 09_LayerNorm that does not subclass the reference: it repeats the
# reference's initialisation (same RNG draws, same order), so its weights match.
LAYERNORM_ANSWER = '''```python
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features, eps):
        super().__init__()
        self.norm = nn.LayerNorm(features, eps=eps)
        nn.init.normal_(self.norm.weight, mean=1.0, std=0.5)
        nn.init.normal_(self.norm.bias, mean=0.0, std=0.5)

    def forward(self, x):
        return self.norm(x)
```'''

# The same module, plus a patch that slows the harness's clock: correct outputs, refused as a hack.
LAYERNORM_HACK = LAYERNORM_ANSWER[: -len("```")] + """
import time as _clock

_real = _clock.perf_counter
_clock.perf_counter = lambda: _real() / 100.0
```"""

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
    """Correct outputs, but it slows the harness's clock: the evaluator must reject it."""
    patched = eager_code(task).rstrip() + (
        "\n\nimport time as _clock\n_real = _clock.perf_counter\n_clock.perf_counter = lambda: _real() / 100.0\n")
    return f"Faster timing ahead.\n\n```python\n{patched}```"


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


def steering_kwargs(model_dir: str | Path, answers: list[str], context: int = 16, bias: float = 30.0) -> dict:
    """TRL generation_kwargs that make any model with this tokenizer write one of `answers`.

    Every token of every answer gets `bias` added when the `context` tokens before it match; where the
    answers share a prefix and then diverge, both continuations are boosted alike, so samples pick
    one of the answers at random (a group of GRPO completions then holds different verdicts).
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    generation_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                                      tokenize=False)
    tail = tokenizer(generation_prompt, add_special_tokens=False)["input_ids"][-3:]
    keys: dict[tuple, float] = {}
    for answer in answers:
        tokens = tail + tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for j in range(len(tail), len(tokens)):
            keys[tuple(tokens[max(0, j - context):j + 1])] = bias
    return {"sequence_bias": [[list(key), value] for key, value in keys.items()]}
