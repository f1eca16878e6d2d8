"""Offline vLLM engine with the `complete` interface of `LLMClient` (GPU hosts only).

A thin wrapper: it loads `vllm.LLM` in this process and runs `LLM.chat` in a worker thread so the
event loop stays responsive. Calls are serialised (vLLM's offline engine is not re-entrant); use
`complete_many` to hand it a whole batch, which is where an offline engine pays off.
vllm is imported only when an engine is built, so importing this module is always cheap.
This module is not exercised by the CPU test suite.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from typing import Any, Iterable

from cuda_l1.errors import UserError
from cuda_l1.llm.client import Completion, EndpointStats, Message, split_tokens, sum_stats


def _import_vllm() -> Any:
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise UserError(
            f"the offline engine needs vllm, which is not importable here ({exc}); "
            "install the vllm extra on a GPU host (`pip install 'cuda-l1[vllm]'`), "
            "or serve the model with `vllm serve` and point --base-url at it"
        ) from None


class VLLMEngine:
    """Local model loaded with vLLM; `complete` mirrors `LLMClient.complete`."""

    def __init__(
        self,
        model: str,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 4096,
        seed: int | None = None,
        **engine_kwargs: Any,  # passed to vllm.LLM (tensor_parallel_size, gpu_memory_utilization, ...)
    ):
        self._vllm = _import_vllm()
        self.model = model
        self.defaults = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
        if seed is not None:
            engine_kwargs.setdefault("seed", seed)
        self._llm = self._vllm.LLM(model=model, **engine_kwargs)
        self._lock = threading.Lock()
        self._stats = EndpointStats()
        self.endpoint = f"vllm://{model}"

    def __repr__(self) -> str:
        return f"VLLMEngine(model={self.model!r})"

    async def __aenter__(self) -> "VLLMEngine":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Nothing to release per call; the engine lives as long as this object."""

    def stats(self) -> dict[str, dict[str, int | float]]:
        return {self.endpoint: self._stats.as_dict()}

    def totals(self) -> dict[str, int | float]:
        return sum_stats(self.stats())

    async def complete(self, messages: list[Message], n: int = 1, **overrides: Any) -> list[Completion]:
        return (await self.complete_many([messages], n, **overrides))[0]

    async def complete_many(
        self, conversations: Iterable[list[Message]], n: int = 1, **overrides: Any
    ) -> list[list[Completion]]:
        """Generate `n` answers for each conversation in one batched engine call.

        `overrides` are SamplingParams fields (temperature, top_p, max_tokens, stop, seed, ...).
        Unlike the HTTP client, an engine failure (e.g. CUDA OOM) is returned as failed Completions.
        """
        conversations = [list(c) for c in conversations]
        params = self._vllm.SamplingParams(n=n, **{**self.defaults, **overrides})
        started = time.perf_counter()
        try:
            outputs = await asyncio.to_thread(self._generate, conversations, params)
        except Exception as exc:  # the optimizer loop records it and carries on
            self._stats.failures += len(conversations)
            err = f"vllm engine error: {type(exc).__name__}: {exc}"
            latency = time.perf_counter() - started
            return [[self._failed(err, latency) for _ in range(n)] for _ in conversations]
        latency = time.perf_counter() - started
        return [self._to_completions(out, latency) for out in outputs]

    def _generate(self, conversations: list[list[Message]], params: Any) -> list[Any]:
        with self._lock:
            self._stats.requests += len(conversations)
            return self._llm.chat(conversations, sampling_params=params, use_tqdm=False)

    def _to_completions(self, request_output: Any, latency: float) -> list[Completion]:
        prompt_tokens = len(request_output.prompt_token_ids or [])
        choices = list(request_output.outputs)
        # One prompt serves every choice; split it as the HTTP client does so sums stay exact.
        prompt_shares = split_tokens(prompt_tokens, [1] * len(choices))
        out = []
        for choice, share in zip(choices, prompt_shares):
            completion_tokens = len(choice.token_ids)
            out.append(Completion(
                text=choice.text, model=self.model, endpoint=self.endpoint, prompt_tokens=share,
                completion_tokens=completion_tokens, latency_s=latency,
                finish_reason=choice.finish_reason, cost=0.0,
            ))
            self._stats.completion_tokens += completion_tokens
        self._stats.prompt_tokens += prompt_tokens
        self._stats.completions += len(choices)
        self._stats.latency_s += latency
        return out

    def _failed(self, error: str, latency: float) -> Completion:
        return Completion(text="", model=self.model, endpoint=self.endpoint, prompt_tokens=0,
                          completion_tokens=0, latency_s=latency, finish_reason=None, cost=0.0, error=error)
