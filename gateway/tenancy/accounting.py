"""The `Accountant` stage: the exact cost of every finished request, in the ledger, metrics and a usage log.

For a `RequestRecord` (the engine's own usage, streamed or not, also for failed or cancelled requests):
- engine-served (cache miss/bypass): cost = cost_micros(usage, rates(model)); tokens count as `engine`.
- cache hit: cost 0; saved_cache = what the engine would have cost for the cached usage; tokens count as
  `cache`.
- tiering: with `savings_baseline_model` set, saved_tier = max(0, cost at the baseline's rates - cost at
  the serving model's rates) for every request not served by the baseline (hits included, so that
  cost + saved_cache + saved_tier is what the baseline model would have charged).
The row of (UTC day, tenant, model, tier) in the ledger gets the integer fields; Prometheus counters get
the same figures (request counts are the gateway's own `fleetgate_requests_total`, which carries the
same tenant/model/tier labels); one structured log line per request (logger `fleetgate.usage`) keeps the
endpoint and, for a LoRA adapter (recorded under its own name, priced as its base), the base model.
The tier label is "" when no tier applies, as in the gateway's metrics.
A ledger outage is logged and counted, never turned into a failed request: the addition waits in a
bounded in-memory queue (`max_pending`, oldest dropped first) and is written, exactly once (a one-time
token per addition), before the next request's. A stopping gateway gives them one more try (`flush`) and
reports what is still waiting (`unwritten`): memory is all there is, nothing is spooled to disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from fleetgate.core.kvstore import StoreUnavailableError
from fleetgate.core.types import Usage
from fleetgate.gateway.stages import RequestRecord, Unwritten
from fleetgate.gateway.tenancy.ledger import UsageLedger
from fleetgate.gateway.tenancy.metrics import TenancyMetrics
from fleetgate.gateway.tenancy.pricing import MICROS_PER_USD, PriceBook, cost_micros

log = logging.getLogger("fleetgate.usage")


@dataclass(frozen=True, slots=True)
class _Pending:
    day: str
    tenant: str
    model: str
    tier: str
    values: dict[str, int]
    once: str
    request_id: str
    usage: Usage
    attempted: bool = True  # its write was sent or under way (False: cancelled before it)


def utc_day(now_s: float) -> str:
    return datetime.fromtimestamp(now_s, UTC).strftime("%Y-%m-%d")


class TenancyAccountant:
    def __init__(
        self,
        *,
        ledger: UsageLedger,
        prices: PriceBook,
        metrics: TenancyMetrics | None = None,
        savings_baseline_model: str | None = None,
        clock: Callable[[], float] = time.time,
        max_pending: int = 100_000,
    ) -> None:
        self._ledger = ledger
        self._prices = prices
        self._metrics = metrics
        self._baseline = savings_baseline_model
        self._clock = clock
        self._pending: deque[_Pending] = deque(maxlen=max_pending)

    @property
    def ledger(self) -> UsageLedger:
        return self._ledger

    def figures(self, record: RequestRecord) -> dict[str, int]:
        """The ledger fields one request adds (pure; exposed for tests and audits)."""
        usage = record.usage
        hit = record.cache_status.startswith("hit")
        at_model = cost_micros(usage, self._prices.rates(record.model))
        saved_tier = 0
        if self._baseline is not None and record.model != self._baseline:
            saved_tier = max(0, cost_micros(usage, self._prices.rates(self._baseline)) - at_model)
        values = {
            "requests": 1,
            "errors": int(record.status >= 400),
            "cache_hits": int(hit),
            "saved_tier_micros": saved_tier,
        }
        if hit:
            values |= {
                "cache_prompt_tokens": usage.prompt_tokens,
                "cache_completion_tokens": usage.completion_tokens,
                "saved_cache_micros": at_model,
            }
        else:
            values |= {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "cached_tokens": usage.cached_tokens,
                "cost_micros": at_model,
            }
        return values

    async def record(self, record: RequestRecord) -> None:
        await self.account(record)

    async def account(self, record: RequestRecord) -> dict[str, int]:
        """Record one request; return the ledger fields it added (its `cost_micros` feeds the budgets)."""
        await self._prices.refresh_if_stale(record.model)
        values = self.figures(record)
        tier = record.tier or ""
        hit = bool(values["cache_hits"])
        self._observe_metrics(record, tier=tier, values=values)
        log.info(
            "usage",
            extra={
                "request_id": record.request_id, "tenant": record.tenant.id, "model": record.model, "tier": tier,
                "base": self._prices.base_of(record.model),
                "endpoint": record.endpoint, "cache": record.cache_status, "status": record.status,
                "stream": record.stream, "prompt_tokens": record.usage.prompt_tokens,
                "completion_tokens": record.usage.completion_tokens, "cached_tokens": record.usage.cached_tokens,
                "cost_micros": values.get("cost_micros", 0), "saved_cache_micros": values.get("saved_cache_micros", 0),
            },
        )
        entry = _Pending(day=utc_day(self._clock()), tenant=record.tenant.id, model=record.model, tier=tier,
                         values=values, once=os.urandom(9).hex(), request_id=record.request_id, usage=record.usage)
        added = sent = False
        try:
            await self._flush_pending()
            sent = True
            await self._add(entry)
            added = True
            if not hit:
                await self._prices.observe(record.model, record.usage)
        except asyncio.CancelledError:
            if not added:  # a stopping gateway's deadline: kept for `unwritten()`, never silently dropped
                self._pending.append(entry if sent else replace(entry, attempted=False))
            raise
        except StoreUnavailableError as exc:
            if self._metrics is not None:
                self._metrics.store_errors.labels(op="record").inc()
            self._pending.append(entry)
            log.warning("usage ledger unavailable; the request is kept in memory and retried",
                        extra={"request_id": record.request_id, "pending": len(self._pending), "error": str(exc)})
        return values

    @property
    def pending(self) -> int:
        """Ledger additions waiting for the store to come back."""
        return len(self._pending)

    async def _add(self, entry: _Pending) -> None:
        await self._ledger.add(day=entry.day, tenant=entry.tenant, model=entry.model, tier=entry.tier,
                               values=entry.values, once=entry.once)

    async def _flush_pending(self) -> None:
        while self._pending:
            entry = self._pending.popleft()  # taken before the await: concurrent flushers never share one
            try:
                await self._add(entry)
            except (StoreUnavailableError, asyncio.CancelledError):
                self._pending.appendleft(entry)
                raise

    async def flush(self) -> None:
        """Write the additions a store outage left waiting (a stopping gateway's last try); they stay on failure."""
        with contextlib.suppress(StoreUnavailableError):
            await self._flush_pending()

    def unwritten(self) -> list[Unwritten]:
        """Take the additions still waiting (the exit report's: `Flow.shutdown`)."""
        items = [Unwritten(request_id=e.request_id, tenant=e.tenant, model=e.model, tier=e.tier, usage=e.usage,
                           cost_micros=e.values.get("cost_micros", 0), attempted=e.attempted) for e in self._pending]
        self._pending.clear()
        return items

    def _observe_metrics(self, record: RequestRecord, *, tier: str, values: dict[str, int]) -> None:
        m = self._metrics
        if m is None:
            return
        labels = {"tenant": record.tenant.id, "model": record.model, "tier": tier}
        source = "cache" if values["cache_hits"] else "engine"
        u = record.usage
        for kind, amount in (("prompt", u.prompt_tokens), ("completion", u.completion_tokens),
                             ("cached", u.cached_tokens)):
            m.tokens.labels(**labels, kind=kind, source=source).inc(amount)
        m.cost.labels(**labels).inc(values.get("cost_micros", 0) / MICROS_PER_USD)
        m.savings.labels(**labels, source="cache").inc(values.get("saved_cache_micros", 0) / MICROS_PER_USD)
        m.savings.labels(**labels, source="tiering").inc(values["saved_tier_micros"] / MICROS_PER_USD)
