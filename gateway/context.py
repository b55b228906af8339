"""Per-request state carried through the pipeline, and what the pipeline hands to the web layer."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from fleetgate.cache.types import CacheLookup, CacheRequest
from fleetgate.core.types import Endpoint, Usage
from fleetgate.gateway.engine_usage import fallback_usage
from fleetgate.gateway.parsing import ParsedRequest
from fleetgate.gateway.stages import ANONYMOUS, Reservation, Tenant
from fleetgate.router.tiers.types import TierDecision
from fleetgate.router.types import Decision, RoutingRequest

_MAX_ID = 128


def request_id_from(headers: Mapping[str, str]) -> str:
    """The client's `x-request-id` when it is sane (printable ASCII, <= 128 chars), else a new one."""
    given = headers.get("x-request-id")
    if given and len(given) <= _MAX_ID and given.isascii() and given.isprintable():
        return given
    return os.urandom(12).hex()


class ClientStream(Protocol):
    """Bytes for the client; the web layer calls `close()` exactly once, however the stream ends."""

    def __aiter__(self) -> ClientStream: ...

    async def __anext__(self) -> bytes: ...

    def close(self, *, cancelled: bool = False) -> None: ...


@dataclass(slots=True)
class GatewayResponse:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: ClientStream | None = None
    media_type: str = "application/json"


@dataclass(slots=True)
class Attempt:
    """One engine call: the concrete model and tier it went to, and where."""

    model: str
    tier: str | None
    endpoint: Endpoint
    routing: RoutingRequest
    decision: Decision


@dataclass(slots=True)
class RequestContext:
    request_id: str
    received_at: float  # perf_counter
    arrived_ns: int = 0  # perf_counter_ns when the ASGI handler was entered (0: the door has no such clock)
    before_upstream_ns: int = 0  # arrival -> the first answered engine request's bytes sent (0: not measured)
    tenant: Tenant = ANONYMOUS
    parsed: ParsedRequest | None = None
    reservation: Reservation | None = None
    cache_request: CacheRequest | None = None
    lookup: CacheLookup | None = None
    tier: TierDecision | None = None
    attempts: list[Attempt] = field(default_factory=list)
    served_model: str | None = None
    served_tier: str | None = None
    authenticated: bool = False
    finished: bool = False
    prompt_estimate: int = 0  # a rough prompt count (<= the reservation's): charged when an engine's usage is unknown
    completion_cap: int | None = None  # completion tokens reserved over all sequences: never charged beyond
    spent: Usage | None = None  # engine work so far (None: unknown); charged when no complete answer comes
    # The requested model as records may name it: a placeholder until the name is authorized and known.
    model_label: str = ""

    def unanswered_usage(self) -> Usage:
        """What a request that got no complete answer is charged: the engine's work so far, else (an engine
        was reached, its usage unknown) the prompt estimate, else nothing."""
        if self.spent is not None:
            return self.spent
        if self.attempts:
            return fallback_usage(prompt_estimate=self.prompt_estimate, output_chunks=0)
        return Usage()
