"""The response-cache contract between the gateway and the caches.

The gateway turns each request into a `CacheRequest` (pure data), calls `lookup` before
routing and `store` after a successful, complete response. Hits carry a complete OpenAI
(non-streaming) response body; the gateway replays it as SSE when the client streams
(`fleetgate.gateway.replay`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol


class CacheStatus(StrEnum):
    HIT_EXACT = "hit-exact"
    HIT_SEMANTIC = "hit-semantic"
    MISS = "miss"
    BYPASS = "bypass"


@dataclass(slots=True)
class CacheRequest:
    tenant: str
    model: str  # concrete model (after tier resolution)
    kind: Literal["chat", "completions", "responses", "messages", "embeddings"]
    body: Mapping[str, Any]  # the client's request body
    no_cache: bool = False  # Cache-Control: no-cache -> do not serve from cache (may still store)
    no_store: bool = False  # Cache-Control: no-store -> neither serve nor store
    allow_sampled: bool = False  # caller opted in to caching sampled (temperature > 0) requests


@dataclass(slots=True)
class CacheLookup:
    status: CacheStatus
    response: dict[str, Any] | None = None  # complete non-streaming OpenAI response on a hit
    similarity: float | None = None
    reason: str = ""  # why bypass/miss (for logs and the debug header)
    # the embedding of the last user message as written, when the lookup computed it (the tier router reuses
    # it); None when the cache embedded a spelling-corrected text instead
    embedding: Any | None = None
    state: dict[str, Any] = field(default_factory=dict)  # opaque to the gateway, handed back to store()


class ResponseCache(Protocol):
    async def lookup(self, req: CacheRequest) -> CacheLookup: ...

    async def store(self, req: CacheRequest, lookup: CacheLookup, response: Mapping[str, Any]) -> None: ...


class NoCache:
    """Caching off: every request bypasses."""

    async def lookup(self, req: CacheRequest) -> CacheLookup:
        return CacheLookup(status=CacheStatus.BYPASS, reason="cache disabled")

    async def store(self, req: CacheRequest, lookup: CacheLookup, response: Mapping[str, Any]) -> None:
        return None
