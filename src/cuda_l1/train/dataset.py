"""SFT datasets: verified (prompt, completion) pairs, as JSONL and as a Hugging Face dataset on disk.

One row per verified candidate, in TRL's conversational prompt-completion format:

    {"prompt": [{"role": "system", ...}, {"role": "user", ...}],
     "completion": [{"role": "assistant", "content": ANSWER}],
     "task_id": ..., "task_name": ..., "candidate_id": ..., "speedup": ..., "model": ..., "format": ...}

ANSWER is the model's full answer ("full") or a canonical answer ("canonical"): the model's analysis
followed by the verified code in one ```python block, nothing else (drafts, chatter and anything
after the code are dropped, so the fine-tuned model learns the answer format the parser expects).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from cuda_l1.contrastive.prompt import fenced
from cuda_l1.errors import UserError
from cuda_l1.train.attempts import Outcome

FORMATS = ("full", "canonical")
TRAIN_COLUMNS = ("prompt", "completion")


def canonical_answer(code: str, analysis: str = "") -> str:
    analysis = analysis.strip()
    block = fenced(code.rstrip() + "\n")
    return f"{analysis}\n\n{block}" if analysis else block


def make_row(messages: list[dict], outcome: Outcome, answer_format: str = "full", **extra) -> dict:
    """The dataset row for one verified outcome."""
    if answer_format not in FORMATS:
        raise UserError(f"completion_format is one of {', '.join(FORMATS)} (got {answer_format!r}).")
    if answer_format == "full":
        answer = outcome.attempt.text
    else:
        answer = canonical_answer(outcome.code or "", outcome.analysis)
    return {
        "prompt": [{"role": m["role"], "content": m["content"]} for m in messages],
        "completion": [{"role": "assistant", "content": answer}],
        "task_id": outcome.attempt.task.id,
        "task_name": outcome.attempt.task.name,
        "candidate_id": outcome.candidate_id or "",
        "speedup": outcome.speedup,
        "model": outcome.attempt.model,
        "format": answer_format,
        **extra,
    }


def append_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("a", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
        handle.flush()
    return count


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise UserError(f"not a JSON line: {exc.msg}.", path=str(path), line=number) from None
    return rows


def dedupe(rows: Iterable[dict]) -> list[dict]:
    """One row per (task, candidate) (a resumed run may have written a row twice)."""
    seen, out = set(), []
    for row in rows:
        key = (row.get("task_id"), row.get("candidate_id"), json.dumps(row.get("completion")))
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def check_rows(rows: list[dict], where: str) -> None:
    for i, row in enumerate(rows, start=1):
        prompt, completion = row.get("prompt"), row.get("completion")
        ok = isinstance(prompt, list) and isinstance(completion, list) and all(
            isinstance(m, dict) and "role" in m and "content" in m for m in [*prompt, *completion])
        if not ok:
            raise UserError("each row needs `prompt` and `completion` as lists of chat messages "
                            "({role, content}).", path=where, line=i)


def save_dataset(rows: list[dict], out_dir: str | Path) -> Path:
    """Write `rows` with datasets' save_to_disk (prompt/completion plus the metadata columns)."""
    from datasets import Dataset

    out = Path(out_dir)
    Dataset.from_list(rows).save_to_disk(str(out))
    return out


def load_rows(source: str | Path) -> list[dict]:
    """Rows from a .jsonl file or a save_to_disk directory."""
    path = Path(source)
    if path.is_dir():
        from datasets import load_from_disk

        return [dict(row) for row in load_from_disk(str(path))]
    if path.suffix == ".jsonl":
        rows = read_jsonl(path)
        check_rows(rows, str(path))
        return rows
    raise UserError("a dataset is a .jsonl file or a directory written by save_to_disk.", path=str(path))


def training_dataset(rows: list[dict]):
    """A datasets.Dataset with only the columns SFTTrainer reads (metadata columns would reach the collator)."""
    from datasets import Dataset

    return Dataset.from_list([{k: row[k] for k in TRAIN_COLUMNS} for row in rows])
