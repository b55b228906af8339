"""The `Limiter` stage: reserve an estimate against every limit at request start, settle to real usage.

reserve(tenant, model, prompt_tokens, max_tokens):
    estimate = 1 request, prompt_tokens + max_tokens tokens (`default_max_tokens` when None; 0 reserves no
    completion: a route that generates nothing), and the cost of those tokens at the model's current rates
    (no prefix-cache discount: an upper bound). A name without a price (a tier alias) is estimated at the
    highest rates in the price book, since any model may serve it. All windows are checked and reserved in
    one atomic step (`CounterBackend.reserve`), so N concurrent requests on any number of replicas can
    overshoot a limit by at most what they reserved while under it and then used beyond their estimate.
settle(reservation, usage):
    adds (real - estimate) to the token and dollar counters the reservation touched (the windows in which
    the request started), also for failed and cancelled requests; rpm stays counted. Where the store lost
    the counters since the reservation (a Redis restart: the counter generation differs), the real usage
    alone is added instead (`limiter_redis`), so the counters end equal to the ledger. The gateway stage
    (`stage.TenancyStage`) splits this in two: tokens at settle, dollars when each request record says
    which model really served (an alias is priced at the model it resolved to).

Requests: `sequences` is the number of completions the engine will generate (prompts x `n`, or
`best_of`); the completion estimate is `max_tokens` per sequence. With `fit_max_tokens` (the client set no
`max_tokens`, so the gateway sets it upstream) a request refused by a token or dollar window is reserved
again at the largest `max_tokens` that still fits, and the reservation's `max_tokens` is what the gateway
forwards: the engine can then never generate more than was reserved.

Store down (`limiter_circuit`): `on_store_error: open` (default) lets requests through unmetered and logs +
counts it (an outage of the limits store should not become an outage of inference); `closed` answers 503.
After a failure the store is not asked for `store_retry_s`; then one request probes it, so the limits
are back within `store_retry_s` of the store whatever the traffic. Settles that cannot be written, and
the whole real usage of requests let through during the outage, are queued (bounded) and replayed when
the store answers again, so the budget counters end equal to the ledger.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from fleetgate.core.errors import RateLimitError, UpstreamUnavailableError
from fleetgate.core.kvstore import StoreUnavailableError
from fleetgate.core.types import Usage
from fleetgate.gateway.stages import Reservation, Tenant
from fleetgate.gateway.tenancy.config import TenancyConfig
from fleetgate.gateway.tenancy.limiter_circuit import Move, StoreCircuit
from fleetgate.gateway.tenancy.limiter_windows import (
    Check,
    ModelLimits,
    TenantLimits,
    describe,
    epoch_key,
    plan_checks,
    retry_after_s,
    window_load,
)
from fleetgate.gateway.tenancy.metrics import TenancyMetrics
from fleetgate.gateway.tenancy.pricing import PriceBook, Rates, cost_micros, usd_to_micros

log = logging.getLogger(__name__)


class CounterBackend(Protocol):
    async def reserve(self, checks: Sequence[Check], *, now_ms: int, epoch_key: str,
                      nonce: str) -> tuple[int, int, int, str]:
        """(0, 0, 0, the tenant's counter generation) when reserved, else (refusing check, cur, prev, "")."""
        ...

    async def adjust(self, moves: Sequence[Move]) -> None: ...

    async def read(self, keys: Sequence[str]) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class HeldDollars:
    """The dollar windows a settled reservation still holds, until `charge` knows the real cost."""

    keys: list[list[Any]]  # [counter key, ttl ms]
    estimate_micros: int  # what the reservation added to them (0: let through while the store was down)
    epoch_key: str = ""
    epoch: str = ""  # the counters' generation the estimate went into ("" : none)


def _micros(usd: Any) -> int | None:
    return usd_to_micros(usd) if usd is not None else None


def limits_from_config(config: TenancyConfig) -> dict[str, TenantLimits]:
    return {
        t.id: TenantLimits(
            rpm=t.rpm,
            tpm=t.tpm,
            daily_micros=_micros(t.daily_budget_usd),
            monthly_micros=_micros(t.monthly_budget_usd),
            models=tuple(
                (model, ModelLimits(daily_micros=_micros(b.daily_budget_usd),
                                    monthly_micros=_micros(b.monthly_budget_usd)))
                for model, b in t.model_budgets.items()
            ),
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
        max_pending: int = 100_000,
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
        self.circuit = StoreCircuit(retry_s=config.store_retry_s, max_pending=max_pending)

    def limits(self, tenant_id: str) -> TenantLimits:
        return self._limits.get(tenant_id, TenantLimits())

    def _store_error(self, op: str, exc: Exception, started: float) -> None:
        self.circuit.failed(started)
        if self._metrics is not None:
            self._metrics.store_errors.labels(op=op).inc()
        log.warning("tenancy limits store unavailable", extra={"op": op, "error": str(exc)})

    def _estimate(self, tenant: Tenant, model: str, *, prompt: int, per_seq: int, sequences: int,
                  rates: Rates) -> Reservation:
        completion = per_seq * sequences
        micros = cost_micros(Usage(prompt_tokens=prompt, completion_tokens=completion), rates)
        return Reservation(tenant=tenant, model=model, estimated_tokens=prompt + completion, estimated_micros=micros)

    def _checks(self, tenant: Tenant, reservation: Reservation, limits: TenantLimits, now: float) -> list[Check]:
        return plan_checks(prefix=self._prefix, tenant_id=tenant.id, limits=limits, now_s=now,
                           tokens=reservation.estimated_tokens, micros=reservation.estimated_micros,
                           sliding=self._sliding, model=reservation.model)

    async def reserve(
        self, tenant: Tenant, model: str, *, prompt_tokens: int, max_tokens: int | None,
        sequences: int = 1, fit_max_tokens: bool = False,
    ) -> Reservation:
        await self._prices.refresh_if_stale(model)
        per_seq = max_tokens if max_tokens is not None and max_tokens >= 0 else self._default_max_tokens
        sequences = max(sequences, 1)
        prompt = max(prompt_tokens, 0)
        rates = self._prices.estimate_rates(model)
        reservation = self._estimate(tenant, model, prompt=prompt, per_seq=per_seq, sequences=sequences, rates=rates)
        limits = self.limits(tenant.id)
        if not limits.any:
            return reservation
        now = self._clock()
        now_ms = int(now * 1000)
        checks = self._checks(tenant, reservation, limits, now)
        if not checks:  # only caps on other models
            return reservation
        # A token or dollar window of this request (not another model's cap): its overrun the gateway bounds
        # by setting `max_tokens` upstream.
        fit = fit_max_tokens and any(c.name != "rpm" for c in checks)
        epochs = epoch_key(prefix=self._prefix, tenant_id=tenant.id)
        answer = await self._try_reserve(checks, now_ms=now_ms, epoch_key=epochs)
        if answer is not None and answer[0] and fit:
            fitted = self._fit(checks[answer[0] - 1], answer, now_ms=now_ms, prompt=prompt, sequences=sequences,
                               rates=rates)
            if 1 <= fitted < per_seq:
                per_seq = fitted
                reservation = self._estimate(tenant, model, prompt=prompt, per_seq=per_seq, sequences=sequences,
                                             rates=rates)
                checks = self._checks(tenant, reservation, limits, now)
                answer = await self._try_reserve(checks, now_ms=now_ms, epoch_key=epochs)
        if fit:
            reservation.max_tokens = per_seq
        if answer is None:  # store down, failing open: usage is queued at settle (reconciled later)
            reservation.token = self._held(checks, epoch_key=epochs, epoch="")
            return reservation
        refused, cur, prev, epoch = answer
        if refused:
            check = checks[refused - 1]
            if self._metrics is not None:
                self._metrics.limited.labels(tenant=tenant.id, limit=check.name).inc()
            load = window_load(check=check, cur=cur, prev=prev, now_ms=now_ms)
            code = "insufficient_quota" if check.name.endswith("budget") else "rate_limit_exceeded"
            raise RateLimitError(
                describe(check, tenant_id=tenant.id, load=load, model=model),
                retry_after_s=retry_after_s(check=check, cur=cur, prev=prev, now_ms=now_ms),
                code=code, limit=check.name,
            )
        reservation.token = self._held(checks, epoch_key=epochs, epoch=epoch)
        return reservation

    @staticmethod
    def _held(checks: Sequence[Check], *, epoch_key: str, epoch: str) -> str:
        """The settle handle: the counters reserved in, and their generation ("": nothing was reserved)."""
        held = {
            "tokens": [[c.key, c.ttl_ms] for c in checks if c.name == "tpm"],
            "micros": [[c.key, c.ttl_ms] for c in checks if c.name.endswith("budget")],
            "epoch": [epoch_key, epoch],
        }
        return orjson.dumps(held).decode()

    def _fit(self, check: Check, answer: tuple[int, int, int, str], *, now_ms: int, prompt: int, sequences: int,
             rates: Rates) -> int:
        """The largest max_tokens per sequence that fits the refusing window (0: none does)."""
        if check.name == "rpm":
            return 0
        room = check.limit - window_load(check=check, cur=answer[1], prev=answer[2], now_ms=now_ms)
        if check.name == "tpm":
            return max(0, int((room - prompt) // sequences))
        lo, hi = 0, 1
        while cost_micros(Usage(prompt_tokens=prompt, completion_tokens=hi * sequences), rates) <= room:
            lo, hi = hi, hi * 2
            if hi > 1 << 40:
                return lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if cost_micros(Usage(prompt_tokens=prompt, completion_tokens=mid * sequences), rates) <= room:
                lo = mid
            else:
                hi = mid
        return lo

    async def _try_reserve(self, checks: Sequence[Check], *, now_ms: int,
                           epoch_key: str) -> tuple[int, int, int, str] | None:
        """The store's answer, or None when the store is down and the policy is to fail open."""
        started = self.circuit.admit()
        if started is not None:
            try:
                # Queued moves first: after a restart they must find the counters as the outage left them
                # (absent), before this reservation creates them again.
                await self._write_pending()
                answer = await self._counters.reserve(checks, now_ms=now_ms, epoch_key=epoch_key,
                                                      nonce=os.urandom(8).hex())
            except StoreUnavailableError as exc:
                self._store_error("reserve", exc, started)
            except asyncio.CancelledError:
                self.circuit.abandoned()
                raise
            else:
                self.circuit.succeeded(started)
                return answer
        if self._fail_open:
            return None
        raise UpstreamUnavailableError("the limits store is unavailable and tenancy.on_store_error is 'closed'")

    async def settle(self, reservation: Reservation, usage: Usage) -> None:
        """Settle tokens and dollars, pricing `usage` at the reserved model's rates."""
        held = await self.settle_tokens(reservation, usage)
        real = cost_micros(usage, self._prices.rates(reservation.model))
        await self.charge(held, real - held.estimate_micros, real_micros=real)

    async def settle_tokens(self, reservation: Reservation, usage: Usage) -> HeldDollars:
        """Settle the token windows now; return the dollar windows for `charge` (once the real cost is known)."""
        if not reservation.token:
            return HeldDollars(keys=[], estimate_micros=0)
        held: dict[str, Any] = orjson.loads(reservation.token)
        reservation.token = ""  # settle once, even if called twice
        epoch_key, epoch = held["epoch"]
        real = usage.total_tokens
        delta = real - (reservation.estimated_tokens if epoch else 0)
        await self._adjust([Move(key, delta, ttl, real, epoch_key, epoch) for key, ttl in held["tokens"]],
                           op="settle")
        return HeldDollars(keys=held["micros"], estimate_micros=reservation.estimated_micros if epoch else 0,
                           epoch_key=epoch_key, epoch=epoch)

    async def charge(self, held: HeldDollars, delta_micros: int, *, real_micros: int) -> None:
        """Move the dollar windows by `delta_micros` where they still hold the estimate (same generation);
        elsewhere add `real_micros`, the real cost alone (`Move`)."""
        await self._adjust([Move(key, delta_micros, ttl, real_micros, held.epoch_key, held.epoch)
                            for key, ttl in held.keys], op="settle")

    async def _adjust(self, moves: list[Move], *, op: str) -> None:
        moves = [m for m in moves if m.delta or m.absolute]
        if not moves:
            return
        started = self.circuit.admit()
        if started is None:
            self.circuit.queue(moves)
            return
        try:
            await self._write_pending()
            await self._counters.adjust(moves)
        except StoreUnavailableError as exc:
            self.circuit.queue(moves)
            self._store_error(op, exc, started)
        except asyncio.CancelledError:
            self.circuit.abandoned()
            self.circuit.queue(moves)
            raise
        else:
            self.circuit.succeeded(started)

    async def flush(self) -> None:
        """Write the queued moves now if the store answers (a stopping gateway's last try); they stay queued if not."""
        started = self.circuit.admit()
        if started is None:
            return
        try:
            await self._write_pending()
        except StoreUnavailableError as exc:
            self._store_error("settle", exc, started)
        except asyncio.CancelledError:
            self.circuit.abandoned()
            raise
        else:
            self.circuit.succeeded(started)

    async def _write_pending(self) -> None:
        """Write the moves queued while the store was down; on any failure they stay queued."""
        moves = self.circuit.take()
        if not moves:
            return
        try:
            await self._counters.adjust(moves)
        except BaseException:
            self.circuit.requeue(moves)
            raise
        log.info("tenancy limits store back; queued settles replayed", extra={"moves": len(moves)})

    async def status(self, tenant_id: str) -> dict[str, dict[str, float | int]]:
        """Current use of each configured limit (settled + in flight), for the usage API and the cost page."""
        limits = self.limits(tenant_id)
        if not limits.any:
            return {}
        now = self._clock()
        now_ms = int(now * 1000)
        checks = [(c.name, c) for c in plan_checks(prefix=self._prefix, tenant_id=tenant_id, limits=limits,
                                                    now_s=now, tokens=0, micros=0, sliding=self._sliding)]
        for model, _ in limits.models:  # each model's caps, named `model_daily_budget:<model>`
            checks += [(f"{c.name}:{model}", c) for c in plan_checks(
                prefix=self._prefix, tenant_id=tenant_id, limits=TenantLimits(models=limits.models), now_s=now,
                tokens=0, micros=0, sliding=self._sliding, model=model)]
        keys = [k for _, c in checks for k in (c.key, c.prev_key or c.key)]
        values = await self._counters.read(keys)
        out: dict[str, dict[str, float | int]] = {}
        for i, (name, c) in enumerate(checks):
            load = window_load(check=c, cur=values[2 * i], prev=values[2 * i + 1], now_ms=now_ms)
            out[name] = {"limit": c.limit, "used": round(load, 3),
                         "resets_in_s": round((c.start_ms + c.window_ms - now_ms) / 1000, 3)}
        return out
