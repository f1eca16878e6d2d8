"""Several endpoints behind one `complete`: the paper samples candidates from several models."""

from __future__ import annotations

import asyncio
import random
from typing import Any, Iterable, Literal, Sequence

from cuda_l1.errors import UserError
from cuda_l1.llm.client import Completion, LLMClient, Message, sum_stats
from cuda_l1.llm.endpoints import EndpointConfig

Strategy = Literal["weighted", "round_robin"]


class MultiEndpointClient:
    """Routes each `complete` call to one endpoint, by weight (seeded) or in turn.

    All `n` answers of one call come from the same endpoint (one request, one model). Each endpoint
    keeps its own concurrency bound, retries and stats.
    """

    def __init__(self, configs: Sequence[EndpointConfig], *, strategy: Strategy = "weighted", seed: int = 0):
        if not configs:
            raise UserError("no endpoints configured")
        if strategy not in ("weighted", "round_robin"):
            raise UserError(f"unknown endpoint strategy {strategy!r}; use 'weighted' or 'round_robin'")
        labels = [c.label for c in configs]
        if len(set(labels)) != len(labels):
            raise UserError(f"duplicate endpoint labels {labels}; give each endpoint a distinct `name`")
        self.strategy = strategy
        self._rng = random.Random(seed)
        self.clients = [LLMClient(c, seed=seed + i + 1) for i, c in enumerate(configs)]
        self._weights = [c.weight for c in configs]
        self._turn = 0

    def __repr__(self) -> str:
        labels = ", ".join(c.config.label for c in self.clients)
        return f"MultiEndpointClient(strategy={self.strategy!r}, endpoints=[{labels}])"

    async def __aenter__(self) -> "MultiEndpointClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients))

    def choose(self) -> LLMClient:
        """The endpoint the next request goes to."""
        if self.strategy == "round_robin":
            client = self.clients[self._turn % len(self.clients)]
            self._turn += 1
            return client
        return self._rng.choices(self.clients, weights=self._weights, k=1)[0]

    async def complete(self, messages: list[Message], n: int = 1, **overrides: Any) -> list[Completion]:
        """Same contract as `LLMClient.complete`; `Completion.endpoint` says who answered."""
        return await self.choose().complete(messages, n, **overrides)

    async def complete_many(
        self, conversations: Iterable[list[Message]], n: int = 1, **overrides: Any
    ) -> list[list[Completion]]:
        return list(await asyncio.gather(*(self.complete(c, n, **overrides) for c in conversations)))

    def stats(self) -> dict[str, dict[str, int | float]]:
        """Running totals keyed by endpoint label."""
        out: dict[str, dict[str, int | float]] = {}
        for client in self.clients:
            out.update(client.stats())
        return out

    def totals(self) -> dict[str, int | float]:
        return sum_stats(self.stats())
