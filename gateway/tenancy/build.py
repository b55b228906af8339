"""Assemble the tenancy stage for one gateway app from its `TenancyConfig`.

With a Redis URL every piece that must agree across replicas (limit counters, the usage ledger, the GPU
token meter) lives in Redis; without one, in process memory with the same semantics. `auth_enabled`
is the gateway's `server.auth == "api_key"`; with it off every caller is the anonymous tenant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from fleetgate.core.kvstore import KVStore, MemoryKVStore
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
from fleetgate.gateway.tenancy.stage import TenancyStage


def build_tenancy(
    config: TenancyConfig,
    *,
    registry: CollectorRegistry,
    auth_enabled: bool = True,
    redis_url: str | None = None,
    kvstore: KVStore | None = None,
    adapters: Callable[[], Mapping[str, str]] | None = None,
    base_of: Callable[[str], str | None] | None = None,
) -> TenancyStage:
    """`kvstore` (the app's shared store) holds the GPU token meter; it is not closed by the stage.
    `adapters` (LoRA adapter -> base model, as discovery knows them) prices an adapter as its base; `base_of`
    is its fast per-name lookup."""
    closers: list[Any] = []
    counters: CounterBackend
    ledger: UsageLedger
    if redis_url:
        client = redis_client(redis_url, timeout_s=config.redis_timeout_s,
                              max_connections=config.redis_max_connections)
        closers.append(client)
        counters = RedisCounters(client, url=redis_url)
        ledger = RedisLedger(client, prefix=config.redis_prefix, retention_days=config.usage_retention_days,
                             url=redis_url)
    else:
        counters = MemoryCounters()
        ledger = MemoryLedger()
    metrics = TenancyMetrics(registry)
    metrics.set_budgets(config)
    prices = PriceBook(config, meter=TokenMeter(kvstore if kvstore is not None else MemoryKVStore()),
                       adapters=adapters, base_of=base_of)
    register_price_gauges(registry, prices)
    authenticator: Authenticator = KeyAuthenticator(config) if auth_enabled else OpenAuth()
    return TenancyStage(
        config=config,
        authenticator=authenticator,
        limiter=TenancyLimiter(config, counters=counters, prices=prices, metrics=metrics),
        accountant=TenancyAccountant(ledger=ledger, prices=prices, metrics=metrics,
                                     savings_baseline_model=config.savings_baseline_model),
        ledger=ledger,
        prices=prices,
        metrics=metrics,
        auth_enabled=auth_enabled,
        closers=closers,
    )
