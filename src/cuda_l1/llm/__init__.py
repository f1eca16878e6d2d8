"""LLM access: an async OpenAI-compatible client (one or several endpoints) and an optional offline
vLLM engine, all with the same `await complete(messages, n=1, **overrides) -> list[Completion]`."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from cuda_l1.llm.client import Completion, EndpointStats, LLMClient, Message, split_tokens, sum_stats
from cuda_l1.llm.endpoints import (
    PLACEHOLDER_API_KEY,
    EndpointConfig,
    endpoint_from_dict,
    endpoint_from_flags,
    load_endpoints,
)
from cuda_l1.llm.multi import MultiEndpointClient


class ChatClient(Protocol):
    """What the optimizer and training loops need from any sampler."""

    async def complete(self, messages: list[Message], n: int = 1, **overrides: Any) -> list[Completion]: ...

    def stats(self) -> dict[str, dict[str, int | float]]: ...

    async def aclose(self) -> None: ...


def make_client(configs: Sequence[EndpointConfig], *, strategy: str = "weighted", seed: int = 0) -> ChatClient:
    """One endpoint -> LLMClient; several -> MultiEndpointClient."""
    if len(configs) == 1:
        return LLMClient(configs[0], seed=seed)
    return MultiEndpointClient(configs, strategy=strategy, seed=seed)  # type: ignore[arg-type]


__all__ = [
    "PLACEHOLDER_API_KEY",
    "ChatClient",
    "Completion",
    "EndpointConfig",
    "EndpointStats",
    "LLMClient",
    "Message",
    "MultiEndpointClient",
    "endpoint_from_dict",
    "endpoint_from_flags",
    "load_endpoints",
    "make_client",
    "split_tokens",
    "sum_stats",
]
