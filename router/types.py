"""The scheduling contract between the gateway and the endpoint picker.

The gateway builds a `RoutingRequest` (pure data, no web types), asks a `Scheduler` for a
`Decision`, and reports the outcome back so observers can update their state. The router
package implements `Scheduler` with filters -> scorers -> picker (see `fleetgate.router.scheduler`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleetgate.core.types import Endpoint, Usage


def _new_key() -> str:
    return os.urandom(8).hex()


@dataclass(slots=True)
class RoutingRequest:
    request_id: str  # the client's `x-request-id` when it gave a sane one: for logs, never a key of router state
    model: str  # concrete model name (after tier resolution)
    prompt_text: str  # stable serialisation of the prompt, used for prefix hashing
    tenant: str = "anonymous"
    session_key: str | None = None  # session header or the OpenAI `user` field
    max_tokens: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    adapter: str | None = None  # a LoRA adapter of `model`'s base: candidates serve the base, some have it loaded
    # The OpenAI request as the engine gets it ("chat" or "completions" and its JSON body): what precise prefix
    # routing tokenizes, exactly as the engine will. None where no body exists (simulations, benchmarks).
    kind: str | None = None
    body: Mapping[str, Any] | None = None
    # What keys this request's state in the scheduler and its plugins from pick to completion: unique per
    # request whatever the client sends (two requests with one `x-request-id` must not share a cycle or a
    # queued-prefill entry, or a tenant could move another's prefix or load state by reusing ids).
    key: str = field(default_factory=_new_key)


@dataclass(slots=True)
class Decision:
    endpoint: Endpoint
    fallbacks: list[Endpoint] = field(default_factory=list)  # next-best, for one connect-failure retry
    reasons: dict[str, float] = field(default_factory=dict)  # scorer name -> weighted score (debug header)
    profile: str = "default"


class Scheduler(Protocol):
    async def pick(self, req: RoutingRequest, candidates: Sequence[Endpoint]) -> Decision:
        """Choose an endpoint among `candidates` (all serve `req.model`). Raises
        `fleetgate.core.errors.UpstreamUnavailableError` when none is usable."""
        ...

    def on_start(self, req: RoutingRequest, endpoint: Endpoint) -> None:
        """The request was sent to `endpoint` (in-flight accounting, prefix index update). After a failed call of
        the same request (`on_complete(ok=False)`: a retry on the fallback) it starts with what its pick
        computed, as the first call did."""
        ...

    def on_first_token(self, req: RoutingRequest, endpoint: Endpoint) -> None:
        """The engine sent the request's first generated token: its prefill is over (queued-prefill load)."""
        ...

    def on_complete(self, req: RoutingRequest, endpoint: Endpoint, *, ok: bool, usage: Usage | None) -> None:
        """The request finished (successfully or not)."""
        ...

    def on_connect_error(self, endpoint: Endpoint) -> None:
        """Connecting to `endpoint` failed or timed out: eject it for a back-off period."""
        ...
