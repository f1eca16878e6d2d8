"""Metrics of the parts TRL does not log itself (sampling rounds, self-improvement rounds, rewards):
one JSON line per record, and the same scalars as TensorBoard events next to the trainer's own."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path


class MetricsLog:
    """Append-only metrics: `path` (JSONL) plus TensorBoard events under `tensorboard_dir` when available."""

    def __init__(self, path: str | Path, tensorboard_dir: str | Path | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is in the train extra; without it only the JSONL is written
                SummaryWriter = None
            if SummaryWriter is not None:
                self._writer = SummaryWriter(log_dir=str(tensorboard_dir))

    def log(self, step: int, values: dict, prefix: str = "") -> dict:
        record = {"step": step, "time": time.time(), **values}
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
        if self._writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    self._writer.add_scalar(f"{prefix}{key}", value, step)
            self._writer.flush()
        return record

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
