"""The `Limiter` stage: reserve an estimate against every limit at request start, settle to real usage.

reserve(tenant, model, prompt_tokens, max_tokens):
    estimate = 1 request, prompt_tokens + max_tokens tokens (`default_max_tokens` when the request sets
    none), and the cost of those tokens at the model's current rates (no prefix-cache discount: an upper
    bound). A name without a price (a tier alias) is estimated at the highest rates in the price book,
    since any model may serve it. All windows are checked and reserved in one atomic step
    (`CounterBackend.reserve`), so N concurrent requests on any number of replicas can overshoot a limit
    by at most what they reserved while under it and then used beyond their estimate.
settle(reservation, usage):
    adds (real - estimate) to the token and dollar counters the reservation touched (the windows in which
    the request started), also for failed and cancelled requests; rpm stays counted. The gateway stage
    (`stage.TenancyStage`) splits this in two: tokens at settle, dollars when each request record says
    which model really served (an alias is priced at the model it resolved to).

Store down: `on_store_error: open` (default) lets requests through unmetered and logs + counts it (an
outage of the limits store should not become an outage of inference); `closed` answers 503. After a
failure the store is not asked again for `store_retry_s`, so an outage costs one timeout, not one per
request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import orjson

from fleetgate.core.errors import RateLimitError, UpstreamUnavailableError
from fleetgate.core.kvstore import StoreUnavailableError
from fleetgate.core.types import Usage
from fleetgate.gateway.stages import Reservation, Tenant
from fleetgate.gateway.tenancy.config import TenancyConfig
from fleetgate.gateway.tenancy.limiter_windows import (
    Check,
    TenantLimits,
    describe,
    plan_checks,
    retry_after_s,
    window_load,
)
from fleetgate.gateway.tenancy.metrics import TenancyMetrics
from fleetgate.gateway.tenancy.pricing import PriceBook, cost_micros, usd_to_micros

log = logging.getLogger(__name__)


class CounterBackend(Protocol):
    async def reserve(self, checks: Sequence[Check], *, now_ms: int) -> tuple[int, int, int]: ...

    async def adjust(self, deltas: Sequence[tuple[str, int]]) -> None: ...

    async def read(self, keys: Sequence[str]) -> list[int]: ...


def limits_from_config(config: TenancyConfig) -> dict[str, TenantLimits]:
    return {
        t.id: TenantLimits(
            rpm=t.rpm,
            tpm=t.tpm,
            daily_micros=usd_to_micros(t.daily_budget_usd) if t.daily_budget_usd is not None else None,
            monthly_micros=usd_to_micros(t.monthly_budget_usd) if t.monthly_budget_usd is not None else None,
        )
        for t in config.tenants
    }


class TenancyLimiter:
    def __init__(
        self,
        config: TenancyConfig,
        *,
        counters: CounterBackend,
        prices: PriceBook,
        metrics: TenancyMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._limits = limits_from_config(config)
        self._counters = counters
        self._prices = prices
        self._metrics = metrics
        self._clock = clock
        self._prefix = config.redis_prefix
        self._sliding = config.sliding_minute_windows
        self._default_max_tokens = config.default_max_tokens
        self._fail_open = config.on_store_error == "open"
        self._retry_s = config.store_retry_s
        self._down_until = 0.0  # monotonic; while in the future, the store is not asked (circuit open)

    def limits(self, tenant_id: str) -> TenantLimits:
        return self._limits.get(tenant_id, TenantLimits())

    def _store_error(self, op: str, exc: Exception) -> None:
        self._down_until = time.monotonic() + self._retry_s
        if self._metrics is not None:
            self._metrics.store_errors.labels(op=op).inc()
        log.warning("tenancy limits store unavailable", extra={"op": op, "error": str(exc)})

    async def reserve(self, tenant: Tenant, model: str, *, prompt_tokens: int, max_tokens: int) -> Reservation:
        await self._prices.refresh_if_stale(model)
        completion = max_tokens if max_tokens and max_tokens > 0 else self._default_max_tokens
        tokens = max(prompt_tokens, 0) + completion
        micros = cost_micros(Usage(prompt_tokens=max(prompt_tokens, 0), completion_tokens=completion),
                             self._prices.estimate_rates(model))
        reservation = Reservation(tenant=tenant, model=model, estimated_tokens=tokens, estimated_micros=micros)
        limits = self.limits(tenant.id)
        if not limits.any:
            return reservation
        now = self._clock()
        now_ms = int(now * 1000)
        checks = plan_checks(prefix=self._prefix, tenant_id=tenant.id, limits=limits, now_s=now,
                             tokens=tokens, micros=micros, sliding=self._sliding)
        try:
            if time.monotonic() < self._down_until:
                raise StoreUnavailableError("limits store marked down after a recent failure")
            refused, cur, prev = await self._counters.reserve(checks, now_ms=now_ms)
        except StoreUnavailableError as exc:
            self._store_error("reserve", exc)
            if self._fail_open:
                return reservation
            raise UpstreamUnavailableError(
                "the limits store is unavailable and tenancy.on_store_error is 'closed'"
            ) from exc
        if refused:
            check = checks[refused - 1]
            if self._metrics is not None:
                self._metrics.limited.labels(tenant=tenant.id, limit=check.name).inc()
            load = window_load(check=check, cur=cur, prev=prev, now_ms=now_ms)
            code = "insufficient_quota" if check.name.endswith("budget") else "rate_limit_exceeded"
            raise RateLimitError(
                describe(check, tenant_id=tenant.id, load=load),
                retry_after_s=retry_after_s(check=check, cur=cur, prev=prev, now_ms=now_ms),
                code=code,
            )
        held = {
            "tokens": [c.key for c in checks if c.name == "tpm"],
            "micros": [c.key for c in checks if c.name.endswith("budget")],
        }
        reservation.token = orjson.dumps(held).decode()
        return reservation

    async def settle(self, reservation: Reservation, usage: Usage) -> None:
        """Settle tokens and dollars, pricing `usage` at the reserved model's rates."""
        money_keys = await self.settle_tokens(reservation, usage)
        real = cost_micros(usage, self._prices.rates(reservation.model))
        await self.charge(money_keys, real - reservation.estimated_micros)

    async def settle_tokens(self, reservation: Reservation, usage: Usage) -> list[str]:
        """Settle the token windows now; return the dollar windows for `charge` (once the real cost is known)."""
        if not reservation.token:
            return []
        held: dict[str, list[str]] = orjson.loads(reservation.token)
        reservation.token = ""  # settle once, even if called twice
        delta = usage.total_tokens - reservation.estimated_tokens
        await self._adjust([(key, delta) for key in held["tokens"]], op="settle")
        return held["micros"]

    async def charge(self, keys: Sequence[str], delta_micros: int) -> None:
        await self._adjust([(key, delta_micros) for key in keys], op="settle")

    async def _adjust(self, deltas: list[tuple[str, int]], *, op: str) -> None:
        try:
            await self._counters.adjust(deltas)
        except StoreUnavailableError as exc:
            # The estimate stays counted: conservative for budgets, never an overspend.
            self._store_error(op, exc)

    async def status(self, tenant_id: str) -> dict[str, dict[str, float | int]]:
        """Current use of each configured limit (settled + in flight), for the usage API and the cost page."""
        limits = self.limits(tenant_id)
        if not limits.any:
            return {}
        now = self._clock()
        now_ms = int(now * 1000)
        checks = plan_checks(prefix=self._prefix, tenant_id=tenant_id, limits=limits, now_s=now,
                             tokens=0, micros=0, sliding=self._sliding)
        keys = [k for c in checks for k in (c.key, c.prev_key or c.key)]
        values = await self._counters.read(keys)
        out: dict[str, dict[str, float | int]] = {}
        for i, c in enumerate(checks):
            load = window_load(check=c, cur=values[2 * i], prev=values[2 * i + 1], now_ms=now_ms)
            out[c.name] = {"limit": c.limit, "used": round(load, 3),
                           "resets_in_s": round((c.start_ms + c.window_ms - now_ms) / 1000, 3)}
        return out
