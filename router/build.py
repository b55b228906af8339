"""Assemble a `PluginScheduler` from a `RoutingConfig`: instantiate plugins by type, sort them into
roles by the methods they have, attach weights from the profile."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from fleetgate.core.errors import ConfigError
from fleetgate.core.kvstore import KVStore, MemoryKVStore
from fleetgate.router.config import RoutingConfig
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.health import HealthTracker
from fleetgate.router.load_sync import FleetLoadSync
from fleetgate.router.metrics import CharsPerTokenCollector, RouterMetrics
from fleetgate.router.plugins.base import (
    Closable,
    Filter,
    FirstTokenObserver,
    Observer,
    Picker,
    PluginContext,
    Producer,
    Scorer,
    Startable,
    Syncable,
)
from fleetgate.router.plugins.registry import PluginFactory, instantiate
from fleetgate.router.scheduler import PluginScheduler, Profile


def build_scheduler(
    config: RoutingConfig | None = None,
    *,
    kvstore: KVStore | None = None,
    registry: CollectorRegistry | None = None,
    namespace: str = "default",
    clock: Callable[[], float] | None = None,
    seed: int | None = None,
    scrape: bool = True,
    extra_plugins: Mapping[str, PluginFactory] | None = None,
    source: Any = None,
    adapter_reader: Any = None,
) -> PluginScheduler:
    """Build the scheduler `config` describes (the shipped default when None).

    `kvstore` shares the prefix index, the queued prefill and the in-flight counts between gateway replicas when
    it is not the in-memory store;
    `registry` receives the router's metrics; `scrape=False` leaves out the `/metrics` scraper (the
    caller then feeds `scheduler.state` itself, as the in-process benchmark does); `source` (any object
    with `models()` and `endpoints(model)`) is what `await scheduler.start()` scrapes; `adapter_reader`
    (`fleetgate.router.scraping.AdapterReader`) lets the scraper refresh each engine's loaded LoRA adapters.
    """
    cfg = config or RoutingConfig()
    health_kw: dict[str, Any] = {"base_s": cfg.ejection.base_s, "max_s": cfg.ejection.max_s}
    if clock is not None:
        health_kw["clock"] = clock
    try:
        health = HealthTracker(**health_kw)
    except ValueError as exc:
        raise ConfigError(f"routing ejection settings: {exc}") from exc
    state = FleetState(health=health, **({"clock": clock} if clock is not None else {}))
    metrics = RouterMetrics(registry)
    metrics.registry.register(CharsPerTokenCollector(state.chars_per_token))
    ctx = PluginContext(state=state, kvstore=kvstore, namespace=namespace, rng=random.Random(seed),
                        registry=metrics.registry)
    specs = {p.ref: p for p in cfg.plugins}
    chosen = cfg.profile()
    instances: dict[str, Any] = {}
    profile: Profile | None = None
    pickers: list[Picker] = []
    producers: list[Producer] = []
    filters: list[Filter] = []
    scorers: list[tuple[Scorer, float]] = []
    observers: list[Observer] = []
    first_token: list[FirstTokenObserver] = []
    closables: list[Closable] = []
    startables: list[Startable] = []
    syncables: list[Syncable] = []
    for ref in chosen.plugins:
        spec = specs[ref.plugin_ref]
        plugin = instances.get(spec.ref)
        if plugin is None:
            plugin = instances[spec.ref] = instantiate(
                spec.type, name=spec.ref, parameters=spec.parameters, ctx=ctx, extra=extra_plugins
            )
        roles = 0
        if isinstance(plugin, Producer):
            producers.append(plugin)
            roles += 1
        if isinstance(plugin, Filter):
            filters.append(plugin)
            roles += 1
        if isinstance(plugin, Scorer):
            scorers.append((plugin, ref.weight))
            roles += 1
        if isinstance(plugin, Picker):
            pickers.append(plugin)
            roles += 1
        if isinstance(plugin, Observer):
            observers.append(plugin)
        if isinstance(plugin, FirstTokenObserver):
            first_token.append(plugin)
        if isinstance(plugin, Closable) and plugin not in closables:
            closables.append(plugin)
        if isinstance(plugin, Startable) and plugin not in startables:
            startables.append(plugin)
        if isinstance(plugin, Syncable) and plugin not in syncables:
            syncables.append(plugin)
        if roles == 0 and not isinstance(plugin, Observer):
            raise ConfigError(f"routing plugin {spec.ref!r} ({spec.type}) has no scheduling role")
    if len(pickers) != 1:
        raise ConfigError(f"routing profile {chosen.name!r} needs exactly one picker, found {len(pickers)}")
    profile = Profile(name=chosen.name, picker=pickers[0], producers=producers, filters=filters,
                      scorers=scorers, observers=observers, first_token=first_token, closables=closables,
                      startables=startables, syncables=syncables)
    scraper = None
    if scrape:
        from fleetgate.router.scraping import EndpointScraper

        scraper = EndpointScraper(state=state, metrics=metrics, config=cfg.scrape, adapter_reader=adapter_reader)
    load_sync = None
    shared = cfg.load_sync.shared
    if kvstore is not None and (shared is True or (shared == "auto" and not isinstance(kvstore, MemoryKVStore))):
        load_sync = FleetLoadSync(state=state, kvstore=kvstore, namespace=namespace, clock=state.clock,
                                  interval_s=cfg.load_sync.interval_s, max_age_s=cfg.load_sync.max_age_s)
    return PluginScheduler(profile=profile, state=state, metrics=metrics, scraper=scraper, source=source,
                           load_sync=load_sync)
