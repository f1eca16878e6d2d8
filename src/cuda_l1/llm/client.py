"""Async client for one OpenAI-compatible chat endpoint (vLLM, SGLang, DeepSeek, OpenAI, ...).

Failure policy: `complete` never raises because an endpoint misbehaves. Transient failures (429,
408, 409, 5xx, timeouts, dropped connections) are retried with exponential backoff and jitter; when
the retries run out, or on any other HTTP error (400, 401, 404, ...), `complete` returns `n`
`Completion`s with `text == ""` and `error` set, so an optimizer loop can record them as unusable
and move on. Programming errors (a bad keyword argument) still raise.

The openai library's own retries are switched off so that the counts in `stats()` are the truth.
The API key is read once, when the client is created; it is kept only inside the openai client and
scrubbed from every error message we produce.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import openai

from cuda_l1.llm.endpoints import PLACEHOLDER_API_KEY, EndpointConfig
from cuda_l1.text import encodable

log = logging.getLogger(__name__)

Message = Mapping[str, Any]

# Status codes worth another attempt: rate limits, request timeouts, conflicts, server errors.
_RETRY_STATUS = {408, 409, 429}
# `complete(**overrides)` keys that change our own settings rather than being sent as-is.
_CONFIG_OVERRIDES = {"temperature", "top_p", "max_tokens", "timeout_s", "max_retries", "extra_body", "model"}


@dataclass(frozen=True)
class Completion:
    """One sampled answer (or the failure to get one)."""

    text: str  # the assistant message content ("" on failure)
    model: str  # model that answered (as reported by the server, else the configured one)
    endpoint: str  # base_url of the endpoint (never the key)
    prompt_tokens: int  # this choice's share of the request's prompt tokens
    completion_tokens: int  # this choice's share of the request's completion tokens
    latency_s: float  # wall time of the whole call, retries and backoff included
    finish_reason: str | None  # "stop", "length", ... as reported; None on failure
    cost: float  # price of this choice's tokens under the endpoint's prices
    error: str | None = None  # None on success, else a one-line reason

    def __post_init__(self):
        # JSON may carry a lone surrogate ("\ud800"): Python keeps it in a str, but no UTF-8 store can
        # hold it, so it would fail where the completion is recorded. It becomes "?" here.
        for name in ("text", "model", "finish_reason", "error"):  # every string the server's JSON decides
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, encodable(value))

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class EndpointStats:
    """Running totals for one endpoint."""

    requests: int = 0  # HTTP attempts sent, retries included
    completions: int = 0  # choices returned successfully
    failures: int = 0  # calls that ended without an answer (after retries)
    retries: int = 0  # attempts that were repeats of a failed one
    prompt_tokens: int = 0  # as reported in `usage`
    completion_tokens: int = 0  # as reported in `usage`
    cost: float = 0.0  # from the token counts and the endpoint's prices
    latency_s: float = 0.0  # summed wall time of successful attempts

    def as_dict(self) -> dict[str, int | float]:
        return dataclasses.asdict(self)


def sum_stats(per_endpoint: Mapping[str, Mapping[str, int | float]]) -> dict[str, int | float]:
    """Totals over endpoints of the dicts returned by `stats()`."""
    total: dict[str, int | float] = EndpointStats().as_dict()
    for counters in per_endpoint.values():
        for key, value in counters.items():
            total[key] = total.get(key, 0) + value
    return total


class _Transient(Exception):
    """An attempt failed in a way worth retrying; `wait_s` is a server-suggested delay, if any."""

    def __init__(self, reason: str, wait_s: float | None = None):
        super().__init__(reason)
        self.wait_s = wait_s


class _Permanent(Exception):
    """An attempt failed in a way another attempt will not fix."""


class LLMClient:
    """Bounded-concurrency, retrying chat client for one endpoint.

    Create and use it inside one event loop (the HTTP connection pool and the semaphore belong to it).

        async with LLMClient(cfg) as client:
            answers = await client.complete([{"role": "user", "content": "hi"}], n=4)
    """

    def __init__(self, config: EndpointConfig, *, seed: int | None = None):
        self.config = config
        self._key = os.environ.get(config.api_key_env) or ""
        if not self._key:
            log.debug("%s is not set; using a placeholder key for %s (fine for local vLLM/SGLang servers)",
                      config.api_key_env, config.label)
        self._openai = openai.AsyncOpenAI(
            api_key=self._key or PLACEHOLDER_API_KEY,
            base_url=config.base_url,
            max_retries=0,  # ours are the only retries
            timeout=config.timeout_s + 5.0,  # the hard limit is ours (asyncio.timeout) below
        )
        self._semaphore = asyncio.Semaphore(config.max_concurrency)
        self._rng = random.Random(seed)
        self._stats = EndpointStats()

    def __repr__(self) -> str:
        return f"LLMClient(label={self.config.label!r}, max_concurrency={self.config.max_concurrency})"

    async def __aenter__(self) -> "LLMClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._openai.close()

    def stats(self) -> dict[str, dict[str, int | float]]:
        """Running totals keyed by endpoint label (one entry here; several in MultiEndpointClient)."""
        return {self.config.label: self._stats.as_dict()}

    def totals(self) -> dict[str, int | float]:
        return sum_stats(self.stats())

    async def complete_many(
        self, conversations: Iterable[list[Message]], n: int = 1, **overrides: Any
    ) -> list[list[Completion]]:
        """`complete` for several conversations at once (concurrency still bounded)."""
        return list(await asyncio.gather(*(self.complete(c, n, **overrides) for c in conversations)))

    async def complete(self, messages: list[Message], n: int = 1, **overrides: Any) -> list[Completion]:
        """Sample `n` answers to `messages`; always returns `n` Completions (failed ones have `error`).

        `overrides` may change temperature, top_p, max_tokens, timeout_s, max_retries, model or
        extra_body (merged) for this call; any other keyword (stop, seed, ...) goes to the server as is.
        """
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        if self.config.native_n or n == 1:
            return await self._request(messages, n, overrides)
        parts = await asyncio.gather(*(self._request(messages, 1, overrides) for _ in range(n)))
        return [c for part in parts for c in part]

    async def _request(self, messages: list[Message], n: int, overrides: Mapping[str, Any]) -> list[Completion]:
        cfg = self.config
        timeout_s = float(overrides.get("timeout_s", cfg.timeout_s))
        max_retries = int(overrides.get("max_retries", cfg.max_retries))
        model = overrides.get("model", cfg.model)
        kwargs = self._request_kwargs(model, n, overrides)
        started = time.perf_counter()
        reason = "no attempt made"
        exhausted = False
        for attempt in range(max_retries + 1):
            if attempt:
                self._stats.retries += 1
            try:
                response = await self._attempt(messages, kwargs, timeout_s)
            except _Transient as exc:
                reason = str(exc)
                if attempt < max_retries:
                    wait = self._backoff(attempt, exc.wait_s)
                    log.debug("%s: %s; retry %d/%d in %.2fs", cfg.label, reason, attempt + 1, max_retries, wait)
                    await asyncio.sleep(wait)
                exhausted = True
                continue
            except _Permanent as exc:
                reason, exhausted = str(exc), False
                break
            return self._completions(response, n, model, time.perf_counter() - started)
        self._stats.failures += 1
        if exhausted:
            reason = f"{reason} (gave up after {max_retries + 1} attempts)"
        log.warning("%s: request failed: %s", cfg.label, reason)
        latency = time.perf_counter() - started
        return [
            Completion(text="", model=model, endpoint=cfg.base_url, prompt_tokens=0, completion_tokens=0,
                       latency_s=latency, finish_reason=None, cost=0.0, error=reason)
            for _ in range(n)
        ]

    def _request_kwargs(self, model: str, n: int, overrides: Mapping[str, Any]) -> dict[str, Any]:
        cfg = self.config
        kwargs: dict[str, Any] = {
            "model": model,
            "temperature": overrides.get("temperature", cfg.temperature),
            "top_p": overrides.get("top_p", cfg.top_p),
        }
        max_tokens = overrides.get("max_tokens", cfg.max_tokens)
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        if n != 1:
            kwargs["n"] = n
        extra = {**cfg.extra_body, **(overrides.get("extra_body") or {})}
        if extra:
            kwargs["extra_body"] = extra
        kwargs.update({k: v for k, v in overrides.items() if k not in _CONFIG_OVERRIDES})
        return kwargs

    async def _attempt(self, messages: list[Message], kwargs: dict[str, Any], timeout_s: float) -> Any:
        """One HTTP attempt under the concurrency bound; classifies failures as transient or permanent."""
        async with self._semaphore:
            self._stats.requests += 1
            t0 = time.perf_counter()
            try:
                async with asyncio.timeout(timeout_s):
                    response = await self._openai.chat.completions.create(messages=list(messages), **kwargs)
            except TimeoutError:
                raise _Transient(f"timed out after {timeout_s:g}s") from None
            except openai.APITimeoutError:
                raise _Transient(f"timed out after {timeout_s:g}s") from None
            except openai.APIConnectionError as exc:
                raise _Transient(self._scrub(f"connection error: {_cause(exc)}")) from None
            except openai.APIStatusError as exc:
                reason = self._scrub(f"HTTP {exc.status_code}: {_status_message(exc)}")
                if exc.status_code in _RETRY_STATUS or exc.status_code >= 500:
                    raise _Transient(reason, _retry_after(exc)) from None
                raise _Permanent(reason) from None
            except openai.APIError as exc:  # e.g. a 200 whose body is not a chat completion
                raise _Permanent(self._scrub(f"bad response: {exc}")) from None
            except TypeError:  # a bad keyword from the caller is a bug to surface, not an outage
                raise
            except Exception as exc:  # anything else the endpoint provokes must not stop the loop
                raise _Permanent(self._scrub(f"unexpected {type(exc).__name__}: {exc}")) from None
            self._stats.latency_s += time.perf_counter() - t0
        if isinstance(response, (str, bytes)):  # a 200 that is no JSON: the SDK hands the body back as text
            page = (response.decode("utf-8", "replace") if isinstance(response, bytes) else response).strip()
            raise _Permanent(self._scrub(f"bad response: not a chat completion but text ({page[:80]!r}); the base "
                                         "URL should name the API's root, such as http://HOST:8000/v1"))
        choices = getattr(response, "choices", None)
        if not isinstance(choices, list) or not choices:  # (a body with "choices": 5 got this far)
            raise _Permanent("bad response: no choices")
        return response

    def _backoff(self, attempt: int, server_wait_s: float | None) -> float:
        cfg = self.config
        cap = min(cfg.backoff_max_s, cfg.backoff_base_s * (2 ** attempt))
        # Half fixed, half random: spreads clients that failed together without ever retrying at once.
        wait = cap / 2 + self._rng.uniform(0, cap / 2)
        if server_wait_s is not None:
            wait = max(wait, min(server_wait_s, cfg.backoff_max_s))
        return wait

    def _completions(self, response: Any, n: int, model: str, latency: float) -> list[Completion]:
        cfg = self.config
        choices = list(response.choices)
        usage = getattr(response, "usage", None)
        prompt_total = _token_count(getattr(usage, "prompt_tokens", 0))
        completion_total = _token_count(getattr(usage, "completion_tokens", 0))
        messages = [getattr(c, "message", None) for c in choices]
        texts = [str(getattr(m, "content", None) or "") for m in messages]
        prompt_shares = split_tokens(prompt_total, [1] * len(choices))
        # `usage` is per request; longer answers get a larger share so sums stay exact.
        completion_shares = split_tokens(completion_total, [len(t) + 1 for t in texts])
        self._stats.completions += len(choices)
        self._stats.prompt_tokens += prompt_total
        self._stats.completion_tokens += completion_total
        out = []
        for text, choice, message, p_tok, c_tok in zip(texts, choices, messages, prompt_shares, completion_shares):
            cost = (p_tok * cfg.price_prompt_per_1m + c_tok * cfg.price_completion_per_1m) / 1e6
            self._stats.cost += cost
            out.append(Completion(
                text=text, model=_text_or_none(getattr(response, "model", None)) or model, endpoint=cfg.base_url,
                prompt_tokens=p_tok, completion_tokens=c_tok, latency_s=latency,
                finish_reason=_text_or_none(getattr(choice, "finish_reason", None)), cost=cost,
                error=None if message is not None else "bad response: choice without a message",
            ))
        if len(out) != n:
            log.warning("%s: asked for %d choices, server returned %d", cfg.label, n, len(out))
        return out

    def _scrub(self, text: str) -> str:
        """Remove the key from a message we are about to log or store (a server may echo headers)."""
        if len(self._key) >= 4:
            text = text.replace(self._key, "***")
        return text


def _token_count(value: Any) -> int:
    """A token count as the server reported it, or 0 where it is none: not a whole number from 0 to 10**12
    (a string, NaN, 1e400, a negative count stopped the run or was stored as it was)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return int(value) if math.isfinite(value) and 0 <= value <= 1e12 else 0


def _text_or_none(value: Any) -> str | None:
    """A field the store keeps as text (a finish reason, a model name): a dict there was taken for a
    damaged store when it was written."""
    return value[:200] if isinstance(value, str) else None


def split_tokens(total: int, weights: list[int]) -> list[int]:
    """Integer shares of `total` proportional to `weights`, summing exactly to `total`."""
    if not weights:
        return []
    wsum = sum(weights)
    shares = [total * w // wsum for w in weights]
    shares[0] += total - sum(shares)
    return shares


def _cause(exc: BaseException) -> str:
    inner = exc.__cause__ or exc.__context__
    return f"{type(inner).__name__}: {inner}" if inner is not None else str(exc)


def _status_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        if isinstance(err, str):
            return err[:500]
    return str(exc.message)[:500]


def _retry_after(exc: openai.APIStatusError) -> float | None:
    try:
        value = exc.response.headers.get("retry-after")
        return float(value) if value is not None else None
    except (AttributeError, ValueError):
        return None
