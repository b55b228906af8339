"""`TenancyStage`: one object that is the gateway's Authenticator, Limiter and Accountant.

It joins the limiter and the accountant so that budgets are charged exactly what the ledger records:
- `reserve` holds the estimate (the requested name may be a tier alias; see `limiter`).
- `settle(reservation, usage)` settles the token windows with the request's total usage and keeps the
  reservation's dollar windows and estimate in a context variable of the running task.
- `record(record)` writes the ledger (at the model that really served, cache hits at $0) and then moves
  the dollar windows by (real cost - estimate) in one atomic step: the estimate is released in the same
  operation that adds the real cost, so the spend is never un-counted in between. A cascade's second
  record adds its cost to the same windows.
The pipeline settles and records one request in one task, settle first (`Pipeline._settle`); if no
record follows a settle, the estimate stays counted, which errs on the side of the budget.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from fleetgate.core.types import Usage
from fleetgate.gateway.stages import Authenticator, RequestRecord, Reservation, Tenant, Unwritten
from fleetgate.gateway.tenancy.accounting import TenancyAccountant
from fleetgate.gateway.tenancy.config import TenancyConfig
from fleetgate.gateway.tenancy.ledger import UsageLedger
from fleetgate.gateway.tenancy.limiter import HeldDollars, TenancyLimiter
from fleetgate.gateway.tenancy.metrics import TenancyMetrics
from fleetgate.gateway.tenancy.pricing import PriceBook

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Held:
    tenant_id: str
    dollars: HeldDollars
    released: bool = False


@dataclass
class TenancyStage:
    config: TenancyConfig
    authenticator: Authenticator
    limiter: TenancyLimiter
    accountant: TenancyAccountant
    ledger: UsageLedger
    prices: PriceBook
    metrics: TenancyMetrics
    auth_enabled: bool = True
    closers: list[Any] = field(default_factory=list)
    _held: ContextVar[_Held | None] = field(default_factory=lambda: ContextVar("fleetgate_tenancy_held",
                                                                               default=None))

    # Authenticator
    async def authenticate(self, authorization: str | None) -> Tenant:
        return await self.authenticator.authenticate(authorization)

    def authorize(self, tenant: Tenant, model: str) -> None:
        self.authenticator.authorize(tenant, model)

    # Limiter
    async def reserve(
        self, tenant: Tenant, model: str, *, prompt_tokens: int, max_tokens: int | None,
        sequences: int = 1, fit_max_tokens: bool = False,
    ) -> Reservation:
        return await self.limiter.reserve(tenant, model, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                                          sequences=sequences, fit_max_tokens=fit_max_tokens)

    async def settle(self, reservation: Reservation, usage: Usage) -> None:
        dollars = await self.limiter.settle_tokens(reservation, usage)
        self._held.set(_Held(tenant_id=reservation.tenant.id, dollars=dollars))

    # Accountant
    async def record(self, record: RequestRecord) -> None:
        values = await self.accountant.account(record)
        held = self._held.get()
        if held is None or held.tenant_id != record.tenant.id or not held.dollars.keys:
            return
        cost = values.get("cost_micros", 0)
        delta = cost
        if not held.released:
            delta -= held.dollars.estimate_micros
            held.released = True
        await self.limiter.charge(held.dollars, delta, real_micros=cost)

    async def flush(self) -> None:
        """A stopping gateway's last try at what a store outage left waiting: ledger additions, then counter moves."""
        await self.accountant.flush()
        await self.limiter.flush()

    def unwritten(self) -> list[Unwritten]:
        """Ledger additions still not written (`Flow.shutdown` reports them); budget-counter moves still queued are
        logged here, counted: a lost settle leaves a reservation's estimate counted until its window ends."""
        moves = self.limiter.circuit.pending
        if moves:
            log.warning("shutdown: budget and rate-limit counter moves not written", extra={"moves": moves})
        return self.accountant.unwritten()

    async def aclose(self) -> None:
        for closer in self.closers:
            await closer.aclose()
