"""The `[trainer]` table -> TRL's own config object (`SFTConfig`, `GRPOConfig`), whatever names it uses.

TRL and transformers rename options between releases (transformers 5 dropped `warmup_ratio`, TRL's
SFT `max_seq_length` became `max_length`, ...). Recipes written for either spelling should run, so
an older name is translated to the newer one when the installed class knows only the newer; giving
both is an error. Anything else TRL does not know is an error too: a typo must not become a default.

Stages build these objects when a command starts (`preflight.check_stage`), before hours of sampling,
so a bad `[trainer]` table fails at once and the error names the config file. This module knows no
stage: the stages import it, never the other way round.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any, Callable

from cuda_l1.errors import UserError

# (older name, newer name, older value -> newer value). Applied only when the installed class has the
# newer field and lacks the older one (or keeps it only as a deprecated alias).
RENAMES: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("warmup_ratio", "warmup_steps", float),  # transformers 5: warmup_steps below 1 is a fraction of the steps
    ("max_seq_length", "max_length", int),  # TRL SFTConfig
    ("evaluation_strategy", "eval_strategy", str),  # transformers 4.46
    ("no_cuda", "use_cpu", bool),  # transformers 4.35
    ("vllm_max_model_len", "vllm_max_model_length", int),  # TRL GRPOConfig
    ("gradient_checkpointing", "activation_checkpointing", bool),  # transformers 5: the old name is an alias
    ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs", dict),
)
# Older names the installed transformers still accepts, but only as deprecated aliases.
_ALIASES = {"gradient_checkpointing", "gradient_checkpointing_kwargs"}


def translate(values: dict, known: set[str]) -> dict:
    """`values` with older option names replaced by the ones in `known` (the installed class's fields)."""
    out = dict(values)
    for old, new, convert in RENAMES:
        if old not in out or new not in known or (old in known and old not in _ALIASES):
            continue
        if new in out:
            raise UserError(f"[trainer] gives both {old!r} and {new!r} (the installed version's name for it); "
                            "keep one.")
        out[new] = convert(out.pop(old))
    return out


def build(cls: type, table: dict, defaults: dict | None = None, fixed: dict | None = None) -> Any:
    """`cls(**values)`: our `defaults`, then the user's `table` (translated), then what the stage
    `fixed`; UserError for an unknown option or a value TRL refuses."""
    known = {f.name for f in dataclasses.fields(cls)}
    values = {**(defaults or {}), **translate(table, known), **(fixed or {})}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"[trainer]: unknown option(s) {', '.join(map(repr, unknown))} for trl.{cls.__name__} "
                        f"(trl {_version('trl')}, transformers {_version('transformers')}).")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise UserError(f"[trainer]: {exc}") from None


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "?"
