"""Steered sampling: make a model that cannot write kernels yet (the tiny random model) write given
answers, so that smoke runs and examples exercise the whole mechanism, not only its failure paths.

Sampling stays the policy's own `generate`: a logit bonus (transformers' `sequence_bias`) is added
to the next token of an answer whenever the tokens before it match that answer. Answers that begin
differently compete at the first token, so the samples of one prompt differ from one another: some
correct, some refused, some failing. With the default context (the whole answer so far) a sample
then follows the answer it began; a short context lets samples cross between answers wherever they
share `context` tokens of text. The evaluator judges the samples like any other candidate, and
training updates the policy on them with a real gradient.

It is a smoke-run device, never for a real run: the samples come from the biased distribution, not
from the policy being trained, and the bonus ignores the prompt (an answer to one task may be
sampled for another, which the evaluator then fails).
"""

from __future__ import annotations

from dataclasses import dataclass

from cuda_l1.errors import UserError
from cuda_l1.settings import setting


@dataclass
class SteerSection:
    """Steered sampling for smoke runs (see train/steering.py); off unless answers_file is set."""

    answers_file: str = setting("", 'JSONL of {"task": selector, "text": answer} that '
                                'sampling is pulled towards ("": off)')
    bias: float = setting(30.0, "logit bonus for the next token of an answer (random weights give logits near 0)")
    context: int = setting(1024, "tokens before it that must match (1024: the whole answer so far: no crossing)")

    @property
    def enabled(self) -> bool:
        return bool(self.answers_file)

    def validate(self, where: str) -> None:
        if self.enabled and (self.bias <= 0 or self.context < 1):
            raise UserError(f"[steer] bias must be positive and context at least 1 ({where}).")


def read_answers(section: SteerSection, tasks: list) -> list[str]:
    """The answers of the file that name one of `tasks` (UserError naming the line otherwise)."""
    from cuda_l1.tasks import find_task
    from cuda_l1.train.dataset import read_jsonl

    answers = []
    for number, row in enumerate(read_jsonl(section.answers_file), start=1):
        if not isinstance(row, dict) or not isinstance(row.get("task"), str) or not isinstance(row.get("text"), str):
            raise UserError('each line needs "task" (a task id or name) and "text" (an answer).',
                            path=section.answers_file, line=number)
        try:
            find_task(tasks, row["task"])
        except UserError as exc:
            raise UserError(f"{exc} (only the selected tasks can be named).", path=section.answers_file,
                            line=number) from None
        answers.append(row["text"])
    if not answers:
        raise UserError("[steer] answers_file has no answers.", path=section.answers_file)
    return answers


def sequence_bias(tokenizer, answers: list[str], section: SteerSection) -> list[list]:
    """transformers' `sequence_bias` ([[token ids], bonus] pairs) steering sampling towards `answers`.

    Each key is an answer token with up to `context` tokens before it, starting from the end of the
    chat template's generation prompt, so the first tokens of an answer are steered too; the answer
    ends with the end-of-turn token, so steered samples stop.
    """
    generation_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                                      tokenize=False)
    tail = tokenizer(generation_prompt, add_special_tokens=False)["input_ids"][-3:]
    keys: dict[tuple[int, ...], float] = {}
    for answer in answers:
        tokens = tail + tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for j in range(len(tail), len(tokens)):
            keys[tuple(tokens[max(0, j - section.context):j + 1])] = section.bias
    return [[list(key), value] for key, value in keys.items()]


def steering_kwargs(section: SteerSection, tokenizer, tasks: list) -> dict:
    """Generation keyword arguments for `section` ({} when steering is off)."""
    if not section.enabled:
        return {}
    return {"sequence_bias": sequence_bias(tokenizer, read_answers(section, tasks), section)}
