"""Where a stage writes: its output folder (with the resolved config beside the results) and, unless
the config names another path, the history store inside it."""

from __future__ import annotations

import json
import time
from pathlib import Path

# The store's file name in an output folder: the name `bench` and `optimize` give theirs
# (cuda_l1.bench.STORE_NAME), so one run directory layout holds for every command.
STORE_NAME = "history.sqlite"
# What the training stages called it before; output folders written then still hold it.
LEGACY_STORE_NAME = "history.db"


def prepare_output(output_dir: str | Path, config: dict, name: str) -> Path:
    """Create the output folder and write the resolved config next to the results (for reproducibility)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"{name}-config.json").write_text(json.dumps({"written_at": stamp, **config}, indent=2, default=str))
    return out


def store_path(store: str, output_dir: str | Path) -> Path:
    """The history store: the configured path, else history.sqlite in the output folder.

    A folder from before the rename may hold history.db and no history.sqlite; then that file
    is the store. A resumed run must find its own history there: the SFT ledger of attempts per task,
    the verdicts that spare re-evaluating a program, the exemplars of RL prompts. A fresh history.sqlite
    beside it would silently start that run over.
    """
    # A configured path named history.sqlite gets the same fallback: the shipped example configs
    # named history.db before, and a pipeline started with them must keep its store.
    current = Path(store) if store else Path(output_dir) / STORE_NAME
    if current.name != STORE_NAME:
        return current
    legacy = current.with_name(LEGACY_STORE_NAME)
    return legacy if legacy.exists() and not current.exists() else current
