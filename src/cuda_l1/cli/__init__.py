"""The `cuda-l1` command. Each command group lives in its own module and registers itself on `app`."""

from __future__ import annotations

import importlib
import importlib.util
import sys

from cuda_l1.cli.app import app, run

# One module per command group; each registers its commands on `app` when imported.
COMMAND_MODULES = ("tasks_cmd", "eval_cmd", "bench_cmd", "optimize_cmd", "calibrate_cmd", "train_cmd", "settings_cmd")

for _name in COMMAND_MODULES:
    if importlib.util.find_spec(f"{__name__}.{_name}") is not None:
        importlib.import_module(f"{__name__}.{_name}")


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(argv))


__all__ = ["app", "main"]
