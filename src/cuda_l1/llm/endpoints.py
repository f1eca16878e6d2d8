"""Endpoint configuration: one OpenAI-compatible chat endpoint per `EndpointConfig`.

A config file lists endpoints as TOML (`[[endpoints]]` tables) or JSON (`{"endpoints": [...]}` or a
bare list). Keys live in the environment, never in the file: an endpoint names the variable that
holds its key (`api_key_env`), and a literal `api_key` in a file is refused.

    # endpoints.toml
    [[endpoints]]
    base_url = "http://localhost:8000/v1"
    model = "Qwen/Qwen2.5-Coder-7B-Instruct"
    max_concurrency = 16
    weight = 3

    [[endpoints]]
    base_url = "https://api.deepseek.com/v1"
    model = "deepseek-chat"
    api_key_env = "DEEPSEEK_API_KEY"
    price_prompt_per_1m = 0.27
    price_completion_per_1m = 1.10
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_l1.errors import UserError
from cuda_l1.settings import setting

# Local vLLM / SGLang servers accept any key; the openai library insists on a non-empty one.
PLACEHOLDER_API_KEY = "EMPTY"


@dataclass(frozen=True)
class EndpointConfig:
    """One OpenAI-compatible chat-completions endpoint and how to sample from it."""

    base_url: str = setting(help='server root including the API prefix, e.g. "http://localhost:8000/v1"')
    model: str = setting(help="model name sent in every request")
    api_key_env: str = setting("OPENAI_API_KEY", "name of the environment variable holding the key (not the key)")
    name: str = setting("", 'label in stats and logs; defaults to "model@base_url"')
    max_concurrency: int = setting(8, "requests in flight at once against this endpoint")
    timeout_s: float = setting(120.0, "wall-clock limit for one HTTP attempt")
    max_retries: int = setting(3, "extra attempts after a 429 / 5xx / timeout / connection error")
    backoff_base_s: float = setting(1.0, "first retry waits about this long; doubles each retry")
    backoff_max_s: float = setting(30.0, "upper bound on one backoff wait (also caps a server's Retry-After)")
    temperature: float = setting(1.0, "sampling temperature")
    top_p: float = setting(1.0, "nucleus sampling mass")
    max_tokens: int | None = setting(4096, "completion length limit per choice; None lets the server decide")
    weight: float = setting(1.0, "share of requests when several endpoints are used (relative to the others)")
    price_prompt_per_1m: float = setting(0.0, "currency units per 1M prompt tokens, for cost accounting")
    price_completion_per_1m: float = setting(0.0, "currency units per 1M completion tokens, for cost accounting")
    native_n: bool = setting(True, "server honours `n` in one request; if False, n requests are sent instead")
    extra_body: dict[str, Any] = setting(factory=dict, help="merged into the request JSON (e.g. vLLM top_k)")

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise UserError("bad endpoint config: " + "; ".join(problems))

    @property
    def label(self) -> str:
        """The name used for this endpoint in stats and logs."""
        return self.name or f"{self.model}@{self.base_url}"

    def redacted(self) -> dict[str, Any]:
        """Fields safe to log or store: the key variable's name and whether it is set, never its value."""
        view = dataclasses.asdict(self)
        view["api_key_set"] = bool(os.environ.get(self.api_key_env))
        return view


_FIELDS = {f.name: f for f in dataclasses.fields(EndpointConfig)}
_INT_FIELDS = {"max_concurrency", "max_retries", "max_tokens"}
_FLOAT_FIELDS = {
    "timeout_s", "backoff_base_s", "backoff_max_s", "temperature", "top_p", "weight",
    "price_prompt_per_1m", "price_completion_per_1m",
}
_STR_FIELDS = {"base_url", "model", "api_key_env", "name"}


def _problems(cfg: EndpointConfig) -> list[str]:
    """Everything wrong with a config, as short phrases (empty when it is usable)."""
    out: list[str] = []
    for name in _STR_FIELDS:
        if not isinstance(getattr(cfg, name), str):
            out.append(f"`{name}` must be a string")
    for name in _INT_FIELDS:
        value = getattr(cfg, name)
        if value is None and name == "max_tokens":
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            out.append(f"`{name}` must be an integer, got {value!r}")
    for name in _FLOAT_FIELDS:
        value = getattr(cfg, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            out.append(f"`{name}` must be a finite number, got {value!r}")
    if not isinstance(cfg.native_n, bool):
        out.append(f"`native_n` must be true or false, got {cfg.native_n!r}")
    if not isinstance(cfg.extra_body, dict):
        out.append("`extra_body` must be a table/object")
    if out:  # range checks below assume the types are right
        return out
    if not cfg.base_url.startswith(("http://", "https://")):
        out.append(f"`base_url` must start with http:// or https://, got {cfg.base_url!r}")
    else:
        try:
            parsed = urllib.parse.urlsplit(cfg.base_url)
            parsed.port  # noqa: B018 - raises ValueError for a port that is not a number from 0 to 65535
            if not parsed.hostname:
                raise ValueError("no host")
        except ValueError as exc:
            out.append(f"`base_url` is not a usable URL ({exc}): {cfg.base_url!r}")
    if _not_finite(cfg.extra_body):
        out.append("`extra_body` must hold finite numbers only (JSON has no inf or nan)")
    if not cfg.model.strip():
        out.append("`model` must not be empty")
    if not cfg.api_key_env.strip():
        out.append("`api_key_env` must name an environment variable")
    if cfg.max_concurrency < 1:
        out.append("`max_concurrency` must be at least 1")
    if cfg.timeout_s <= 0:
        out.append("`timeout_s` must be positive")
    if cfg.max_retries < 0:
        out.append("`max_retries` must be 0 or more")
    if cfg.backoff_base_s < 0 or cfg.backoff_max_s < cfg.backoff_base_s:
        out.append("need 0 <= `backoff_base_s` <= `backoff_max_s`")
    if cfg.temperature < 0:
        out.append("`temperature` must be 0 or more")
    if not 0 < cfg.top_p <= 1:
        out.append("`top_p` must be in (0, 1]")
    if cfg.max_tokens is not None and cfg.max_tokens < 1:
        out.append("`max_tokens` must be at least 1")
    if cfg.weight <= 0:
        out.append("`weight` must be positive")
    if cfg.price_prompt_per_1m < 0 or cfg.price_completion_per_1m < 0:
        out.append("prices must be 0 or more")
    return out


def endpoint_from_dict(raw: Any) -> EndpointConfig:
    """Build one endpoint from a parsed table/object; raises UserError (without a file name)."""
    if not isinstance(raw, dict):
        raise UserError(f"an endpoint must be a table/object, got {type(raw).__name__}")
    if "api_key" in raw:
        raise UserError(
            "`api_key` is not accepted in a config file; put the key in an environment variable and "
            "name that variable in `api_key_env`"
        )
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise UserError(f"unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(_FIELDS)}")
    missing = [k for k in ("base_url", "model") if k not in raw]
    if missing:
        raise UserError(f"missing required key(s): {', '.join(missing)}")
    return EndpointConfig(**raw)


def endpoint_from_flags(
    base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", **settings: Any
) -> EndpointConfig:
    """The single endpoint described by `--base-url`, `--model`, `--api-key-env` (plus any other field)."""
    return endpoint_from_dict({"base_url": base_url, "model": model, "api_key_env": api_key_env, **settings})


def _not_finite(value, depth: int = 0) -> bool:
    """Whether a number in `value` (nested dicts and lists) is inf or nan, or it nests past 32 levels."""
    if depth > 32:
        return True
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_not_finite(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_not_finite(v, depth + 1) for v in value)
    return False


def load_endpoints(path: str | Path) -> list[EndpointConfig]:
    """Read and validate an endpoint list from a `.toml` or `.json` file.

    Raises UserError naming the file (and the endpoint's position) when the file is unreadable,
    malformed, empty, or an endpoint is invalid.
    """
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read endpoint config: {exc.strerror or exc}", path=where) from None
    except UnicodeDecodeError as exc:
        raise UserError(f"endpoint config is not UTF-8 text ({exc.reason} at byte {exc.start})", path=where) from None
    raw = _parse(text, path)
    items = raw.get("endpoints") if isinstance(raw, dict) else raw
    if isinstance(raw, dict):
        extra = sorted(set(raw) - {"endpoints"})
        if extra:
            raise UserError(f"unknown top-level key(s) {', '.join(map(repr, extra))}; expected `endpoints`", path=where)
    if not isinstance(items, list) or not items:
        raise UserError("expected a non-empty list of endpoints (`[[endpoints]]` in TOML, "
                        '`{"endpoints": [...]}` or a list in JSON)', path=where)
    configs = []
    for i, item in enumerate(items, start=1):
        try:
            configs.append(endpoint_from_dict(item))
        except UserError as exc:
            raise UserError(f"endpoint #{i}: {exc}", path=where) from None
    labels = [c.label for c in configs]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise UserError(f"duplicate endpoint(s) {', '.join(dupes)}; give each a distinct `name`", path=where)
    return configs


def _parse(text: str, path: Path) -> Any:
    suffix = path.suffix.lower()
    if suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"malformed TOML: {exc}", path=str(path)) from None
        except RecursionError:
            raise UserError("malformed TOML: nested too deeply", path=str(path)) from None
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"malformed JSON: {exc.msg}", path=str(path), line=exc.lineno) from None
        except (ValueError, RecursionError) as exc:  # an integer of thousands of digits; nesting too deep
            raise UserError(f"malformed JSON: {type(exc).__name__}: {exc}", path=str(path)) from None
    raise UserError("endpoint config must be a .toml or .json file", path=str(path))
