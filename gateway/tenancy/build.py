"""Assemble the tenancy stages for one gateway app from its `TenancyConfig`.

With a Redis URL every piece that must agree across replicas (limit counters, the usage ledger, the GPU
token meter) lives in Redis; without one, in process memory with the same semantics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from fleetgate.core.kvstore import KVStore, make_kvstore
from fleetgate.gateway.stages import Authenticator, OpenAuth
from fleetgate.gateway.tenancy.accounting import TenancyAccountant
from fleetgate.gateway.tenancy.config import TenancyConfig
from fleetgate.gateway.tenancy.keys import KeyAuthenticator
from fleetgate.gateway.tenancy.ledger import MemoryLedger, RedisLedger, UsageLedger
from fleetgate.gateway.tenancy.limiter import CounterBackend, TenancyLimiter
from fleetgate.gateway.tenancy.limiter_memory import MemoryCounters
from fleetgate.gateway.tenancy.limiter_redis import RedisCounters
from fleetgate.gateway.tenancy.meter import TokenMeter
from fleetgate.gateway.tenancy.metrics import TenancyMetrics, register_price_gauges
from fleetgate.gateway.tenancy.pricing import PriceBook
from fleetgate.gateway.tenancy.redis_client import redis_client

if TYPE_CHECKING:
    from redis.asyncio import Redis


@dataclass
class Tenancy:
    config: TenancyConfig
    authenticator: Authenticator
    limiter: TenancyLimiter
    accountant: TenancyAccountant
    ledger: UsageLedger
    prices: PriceBook
    metrics: TenancyMetrics
    _closers: list[Redis | KVStore] = field(default_factory=list)

    async def close(self) -> None:
        for c in self._closers:
            await c.aclose() if hasattr(c, "aclose") else await c.close()


def build_tenancy(
    config: TenancyConfig,
    *,
    registry: CollectorRegistry,
    redis_url: str | None = None,
    store: KVStore | None = None,
) -> Tenancy:
    closers: list[Redis | KVStore] = []
    if store is None:
        store = make_kvstore(redis_url, prefix=config.redis_prefix)
        closers.append(store)
    counters: CounterBackend
    ledger: UsageLedger
    if redis_url:
        client = redis_client(redis_url)
        closers.append(client)
        counters = RedisCounters(client, url=redis_url)
        ledger = RedisLedger(client, prefix=config.redis_prefix, retention_days=config.usage_retention_days,
                             url=redis_url)
    else:
        counters = MemoryCounters()
        ledger = MemoryLedger()
    metrics = TenancyMetrics(registry)
    metrics.set_budgets(config)
    prices = PriceBook(config, meter=TokenMeter(store))
    register_price_gauges(registry, prices)
    authenticator: Authenticator = OpenAuth() if config.auth == "disabled" else KeyAuthenticator(config)
    return Tenancy(
        config=config,
        authenticator=authenticator,
        limiter=TenancyLimiter(config, counters=counters, prices=prices, metrics=metrics),
        accountant=TenancyAccountant(ledger=ledger, prices=prices, metrics=metrics,
                                     savings_baseline_model=config.savings_baseline_model),
        ledger=ledger,
        prices=prices,
        metrics=metrics,
        _closers=closers,
    )
