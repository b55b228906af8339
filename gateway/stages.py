"""Contracts for the gateway's tenant stages: authentication, limits and cost accounting.

The request pipeline (`fleetgate.gateway.pipeline`) calls these in order:
authenticate -> authorize(model) -> reserve -> ... forward ... -> settle + record.
Local mode without keys uses the `Open*` defaults below; `fleetgate.gateway.tenancy` provides
the real implementations (API keys, Redis-atomic budgets and rate limits, accounting).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from fleetgate.core.types import Usage


@dataclass(frozen=True, slots=True)
class Tenant:
    id: str
    name: str = ""
    allowed_models: frozenset[str] | None = None  # None: every model
    is_admin: bool = False


ANONYMOUS = Tenant(id="anonymous", name="anonymous (auth off)")


@dataclass(slots=True)
class Reservation:
    tenant: Tenant
    model: str
    estimated_tokens: int
    estimated_micros: int
    token: str = ""  # backend handle to settle with
    max_tokens: int | None = None  # per completion: set upstream when the client set none (bounds the spend)
    completion_per_seq: int = 0  # the completion tokens per sequence the reservation holds (`estimate`)


@dataclass(slots=True)
class RequestRecord:
    """Everything accounting needs about one finished request."""

    request_id: str
    tenant: Tenant
    model: str  # concrete model that served (or would have served, on a cache hit)
    tier: str | None
    endpoint: str | None  # endpoint id; None on a cache hit
    usage: Usage
    status: int
    stream: bool
    cache_status: str  # hit-exact | hit-semantic | miss | bypass
    ttft_s: float | None = None
    duration_s: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Unwritten:
    """A request's usage that was not confirmed written to the accountant's store when the gateway stopped
    (`Flow.shutdown`): its tenant and tokens, for the exit report. `attempted`: its write was sent or under way, so
    a store that was only stalled may still apply it (the ledger drops a duplicate of it, never counts it twice)."""

    request_id: str
    tenant: str
    model: str
    tier: str
    usage: Usage
    cost_micros: int | None  # None: not priced yet
    attempted: bool


class Authenticator(Protocol):
    async def authenticate(self, authorization: str | None) -> Tenant:
        """Raise AuthenticationError (401) for a missing or wrong key."""
        ...

    def authorize(self, tenant: Tenant, model: str) -> None:
        """Raise PermissionDeniedError (403) when the tenant may not use `model`."""
        ...


class Limiter(Protocol):
    async def reserve(
        self, tenant: Tenant, model: str, *, prompt_tokens: int, max_tokens: int | None,
        sequences: int = 1, fit_max_tokens: bool = False,
    ) -> Reservation:
        """Atomically reserve an estimate (`sequences` completions of `max_tokens`); raise RateLimitError (429)
        when over a limit. With `fit_max_tokens` the reservation may lower `max_tokens` to what fits and says
        so in `Reservation.max_tokens`, which the gateway then sets upstream."""
        ...

    async def settle(self, reservation: Reservation, usage: Usage) -> None:
        """Replace the reserved estimate with the real usage (also on failure or cancel)."""
        ...


class Accountant(Protocol):
    async def record(self, record: RequestRecord) -> None: ...


class OpenAuth:
    """Auth off (explicit local-mode setting only)."""

    async def authenticate(self, authorization: str | None) -> Tenant:
        return ANONYMOUS

    def authorize(self, tenant: Tenant, model: str) -> None:
        return None


class NoLimits:
    async def reserve(
        self, tenant: Tenant, model: str, *, prompt_tokens: int, max_tokens: int | None,
        sequences: int = 1, fit_max_tokens: bool = False,
    ) -> Reservation:
        tokens = prompt_tokens + (max_tokens or 0) * max(sequences, 1)
        return Reservation(tenant=tenant, model=model, estimated_tokens=tokens, estimated_micros=0)

    async def settle(self, reservation: Reservation, usage: Usage) -> None:
        return None


class NoAccounting:
    async def record(self, record: RequestRecord) -> None:
        return None
