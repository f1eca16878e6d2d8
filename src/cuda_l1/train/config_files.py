"""Stage config files: TOML or JSON read into dataclasses, with `--set key=value` overrides.

Every stage has one config file. Its top-level keys are the fields of the stage's dataclass; a nested
dataclass is a table (`[eval]`, `[lora]`, ...); the `[trainer]` table is handed to TRL's own config
class (`SFTConfig` / `GRPOConfig`) unchanged, so every TRL option is available without being copied
here. Unknown keys are errors (a typo must not silently become a default).

Relative paths in a config are relative to the working directory, as for every other CLI flag.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cuda_l1.errors import UserError
from cuda_l1.settings import helps_of, setting

T = TypeVar("T")


# -- sections shared by the stages ----------------------------------------------------------------
@dataclass
class ModelSection:
    """The policy: any Hugging Face causal LM, loaded by path."""

    path: str = setting("", "local directory with config.json, weights and tokenizer (save_pretrained layout)")
    dtype: str = setting("auto", "auto, float32, bfloat16 or float16")
    attn_implementation: str = setting("", 'e.g. sdpa, flash_attention_2 ("" = the library default)')
    trust_remote_code: bool = setting(False, "allow model code shipped with the checkpoint")


@dataclass
class LoraSection:
    """Low-rank adapters (PEFT). Off: full fine-tuning."""

    enabled: bool = setting(False, "train LoRA adapters instead of every weight")
    r: int = setting(16, "adapter rank")
    alpha: int = setting(32, "adapter scaling numerator (scale = alpha / r)")
    dropout: float = setting(0.05, "dropout on the adapter input")
    target_modules: list[str] = setting(factory=lambda: ["all-linear"], help="modules to adapt")
    merge: bool = setting(True, "merge adapters into the weights of the final model (so "
                          "vLLM and later stages load it plainly)")


@dataclass
class TaskSection:
    """Which tasks to train on."""

    source: str = setting("builtin", "builtin, a KernelBench-layout directory, a task "
                          ".py file or a .jsonl solution set")
    levels: list[int] = setting(factory=list, help="keep only these levels (empty: all)")
    ids: list[str] = setting(factory=list, help="keep only these tasks: ids, names, L1/NAME keys or level/number")
    limit: int = setting(0, "keep at most this many tasks after filtering (0: no limit)")


@dataclass
class EvalSection:
    """The evaluator that judges every candidate (the reward)."""

    device: str = setting("auto", 'cpu, cuda, cuda:N, a list "cuda:6,cuda:7", or auto (cuda when visible)')
    cluster: str = setting("local", "local, ray or ray://ADDRESS (evaluation hosts apart from the training GPUs)")
    workers: int = setting(0, "CPU workers (device cpu), or a cap on GPU workers (0: one per GPU / one on CPU)")
    quick_timing: bool = setting(False, "shorter timing protocol: CPU smoke runs and tests only")
    tolerance: str = setting("oracle", "oracle (float64 reference) or kernelbench")
    correctness_trials: int = setting(5, "rounds of a correctness-only evaluation (timing off), each checked "
                                      "against the float64 oracle; timed ones draw such rounds at oracle_rate")
    lookahead: int = setting(-1, "candidates a worker loads ahead while it times another (-1: 0 in the RL "
                             "stage, whose rewards are relative within a group: a sibling loading beside a "
                             "candidate's judgement could reach its outputs through a guessed CUDA IPC handle "
                             "and spoil its verdict, docs/isolation.md; the evaluator's default elsewhere)")


# -- reading --------------------------------------------------------------------------------------
def read_table(path: str | Path) -> dict:
    """Parse a .toml or .json config file into a dict (UserError naming the file when malformed)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read the config: {exc.strerror or exc}.", path=str(path)) from None
    except UnicodeDecodeError as exc:
        raise UserError(f"the config is not UTF-8 text ({exc.reason} at byte {exc.start}).", path=str(path)) from None
    suffix = path.suffix.lower()
    if suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"malformed TOML: {exc}.", path=str(path)) from None
        except RecursionError:
            raise UserError("malformed TOML: nested too deeply.", path=str(path)) from None
    elif suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"malformed JSON: {exc.msg}.", path=str(path), line=exc.lineno) from None
        except (ValueError, RecursionError) as exc:  # an integer of thousands of digits; nesting too deep
            raise UserError(f"malformed JSON: {type(exc).__name__}: {exc}.", path=str(path)) from None
    else:
        raise UserError("a stage config is a .toml or .json file.", path=str(path))
    if not isinstance(data, dict):
        raise UserError("a stage config must be a table/object at the top level.", path=str(path))
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b=VALUE' -> (['a', 'b'], value). VALUE is read as a TOML value, else kept as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set expects KEY=VALUE (e.g. trainer.max_steps=3), got {text!r}.")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return [part.strip() for part in key.split(".")], value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise UserError(f"--set {text}: {key!r} is not a table.")
            node = child
        node[keys[-1]] = value
    return data


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check (and lightly convert) one value against a field annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except UserError as exc:
                errors.append(str(exc))
        raise UserError(errors[0] if errors else f"{where}: bad value {value!r}.")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise UserError(f"{where} must be a table, got {value!r}.")
        return from_dict(tp, value, where)
    if origin is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise UserError(f"{where} must be a list, got {value!r}.")
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where} must be a table, got {value!r}.")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where} must be true or false, got {value!r}.")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where} must be an integer, got {value!r}.")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where} must be a number, got {value!r}.")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise UserError(f"{where} must be a string, got {value!r}.")
        return value
    if tp is type(None):
        if value is not None:
            raise UserError(f"{where} must be empty, got {value!r}.")
        return None
    raise UserError(f"{where}: unsupported field type {_type_name(tp)}.")


def from_dict(cls: type[T], data: dict, where: str = "") -> T:
    """Build dataclass `cls` from a dict, refusing unknown keys and values of the wrong type."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        prefix = f"[{where}] " if where else ""
        raise UserError(f"{prefix}unknown key(s) {', '.join(map(repr, unknown))}; known keys: {', '.join(names)}.")
    kwargs = {name: _coerce(value, hints[name], f"{where}.{name}" if where else name) for name, value in data.items()}
    return cls(**kwargs)


def load_config(cls: type[T], path: str | Path | None, overrides: list[str] | None = None) -> T:
    """Read a stage config (file, then `--set` overrides) into `cls`. Errors name the file."""
    data = read_table(path) if path else {}
    apply_overrides(data, list(overrides or []))
    try:
        config = from_dict(cls, data)
    except UserError as exc:
        raise UserError(str(exc), path=str(path) if path else None) from None
    check = getattr(config, "validate", None)
    if callable(check):
        try:
            check()
        except UserError as exc:
            raise UserError(str(exc), path=str(path) if path else None) from None
    return config


def to_dict(config: Any) -> dict:
    """A config as plain data (for the run record and the output directory)."""
    return dataclasses.asdict(config)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(str(value))


def render_template(cls: type) -> str:
    """A TOML config with every field of `cls` at its default and its help as a comment."""
    instance = cls()
    helps = helps_of(cls)
    head, tables = [], []
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        note = f"  # {helps[f.name]}" if f.name in helps else ""
        if dataclasses.is_dataclass(value):
            sub = helps_of(type(value))
            lines = [f"[{f.name}]{note}"]
            for g in dataclasses.fields(value):
                sub_note = f"  # {sub[g.name]}" if g.name in sub else ""
                lines.append(f"{g.name} = {_toml_value(getattr(value, g.name))}{sub_note}")
            tables.append("\n".join(lines))
        elif isinstance(value, dict) and f.name == "trainer":
            tables.append(f"[trainer]{note}\n" + "\n".join(f"{k} = {_toml_value(v)}" for k, v in value.items()))
        else:
            head.append(f"{f.name} = {_toml_value(value)}{note}")
    return "\n".join(head) + "\n\n" + "\n\n".join(tables) + "\n"
