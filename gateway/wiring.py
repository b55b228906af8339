"""Which stage implementation each part of the configuration selects.

One small function per stage, so each stage's owner changes only their own function. Imports of
optional implementations stay inside the functions (lazy), so a gateway that does not use them
never loads them. Extra HTTP routers (tenant usage API, cost page) are added in `build_routers`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from fleetgate.cache.types import NoCache, ResponseCache
from fleetgate.core.kvstore import KVStore
from fleetgate.gateway.discovery import EndpointSource, StaticEndpointSource, adapter_named, adapters_of
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.stages import Accountant, Authenticator, Limiter
from fleetgate.gateway.stageset import Stages
from fleetgate.router.tiers.types import TierResolver
from fleetgate.router.types import Scheduler

if TYPE_CHECKING:
    from fastapi import APIRouter


def build_endpoint_source(
    settings: GatewaySettings, *, registry: CollectorRegistry, kvstore: KVStore
) -> EndpointSource:
    if settings.discovery.kind in ("kubernetes", "inferencepool"):
        module = "kubernetes" if settings.discovery.kind == "kubernetes" else "inferencepool"
        kubernetes = importlib.import_module(f"fleetgate.gateway.discovery.{module}")
        source: EndpointSource = kubernetes.build_source(settings, registry=registry)
        return source
    return StaticEndpointSource(settings.models)


def build_scheduler(
    settings: GatewaySettings, *, registry: CollectorRegistry, kvstore: KVStore, endpoint_source: EndpointSource
) -> Scheduler:
    from fleetgate.gateway.adapter_loading import read_loaded_names
    from fleetgate.router.build import build_scheduler as build_router_scheduler

    return build_router_scheduler(settings.routing, kvstore=kvstore, registry=registry, source=endpoint_source,
                                  adapter_reader=read_loaded_names)


def build_cache(settings: GatewaySettings, *, registry: CollectorRegistry, kvstore: KVStore,
                source: EndpointSource | None = None) -> ResponseCache:
    """The response cache; an encoder service without a `url` (`semantic.embedder: remote`) is found by its
    model name in `source` (the InferenceService's ready pods, or a static route)."""
    if not settings.cache.enabled:
        return NoCache()
    from fleetgate.cache.build import build_cache as build_response_cache

    encoder_model = settings.cache.semantic.remote.model

    def encoder_urls() -> list[str]:
        return [e.url for e in source.endpoints(encoder_model)] if source is not None else []

    return build_response_cache(settings.cache, kvstore=kvstore, registry=registry, endpoints=encoder_urls)


def build_tiers(
    settings: GatewaySettings, *, registry: CollectorRegistry, kvstore: KVStore, cache: ResponseCache | None = None
) -> TierResolver:
    """The tier resolver; it shares the semantic cache's MiniLM embedder when there is one (one model per process)."""
    from fleetgate.cache.embedding import is_minilm
    from fleetgate.router.tiers.build import build_tiers as build_tier_resolver

    shared = getattr(cache, "embedder", None)
    embedder = shared if is_minilm(shared) else None
    return build_tier_resolver(settings.tiers, embedder=embedder, registry=registry)


def build_tenancy_stage(
    settings: GatewaySettings, *, registry: CollectorRegistry, kvstore: KVStore, source: EndpointSource | None = None
) -> tuple[Authenticator, Limiter, Accountant]:
    """Auth, limits and accounting: one `TenancyStage` object (they share prices, counters and metrics).
    `source`'s LoRA adapters are priced and reported with their base model."""
    from fleetgate.gateway.tenancy.build import build_tenancy

    def adapters() -> dict[str, str]:
        return {a.name: a.base for a in adapters_of(source)} if source is not None else {}

    def base_of(model: str) -> str | None:
        spec = adapter_named(source, model) if source is not None else None
        return spec.base if spec is not None else None

    stage = build_tenancy(
        settings.tenancy, registry=registry, auth_enabled=settings.server.auth == "api_key",
        redis_url=settings.redis_url, kvstore=kvstore, adapters=adapters, base_of=base_of,
    )
    return stage, stage, stage


def build_stages(
    settings: GatewaySettings,
    *,
    registry: CollectorRegistry,
    kvstore: KVStore,
    scheduler: Scheduler | None = None,
    cache: ResponseCache | None = None,
    tiers: TierResolver | None = None,
    auth: Authenticator | None = None,
    limiter: Limiter | None = None,
    accountant: Accountant | None = None,
    endpoint_source: EndpointSource | None = None,
) -> Stages:
    """The configured stages; a stage given explicitly replaces the configured one (never built)."""
    r, kv = registry, kvstore
    source = endpoint_source or build_endpoint_source(settings, registry=r, kvstore=kv)
    if auth is None or limiter is None or accountant is None:
        built_auth, built_limiter, built_accountant = build_tenancy_stage(settings, registry=r, kvstore=kv,
                                                                          source=source)
        auth, limiter, accountant = auth or built_auth, limiter or built_limiter, accountant or built_accountant
    cache = cache or build_cache(settings, registry=r, kvstore=kv, source=source)
    return Stages(
        scheduler=scheduler or build_scheduler(settings, registry=r, kvstore=kv, endpoint_source=source),
        cache=cache,
        tiers=tiers or build_tiers(settings, registry=r, kvstore=kv, cache=cache),
        auth=auth,
        limiter=limiter,
        accountant=accountant,
        endpoint_source=source,
    )


def build_routers(
    settings: GatewaySettings, *, stages: Stages, registry: CollectorRegistry, kvstore: KVStore
) -> list[APIRouter]:
    """Extra FastAPI routers mounted on the app (e.g. the tenant usage API, the cost page)."""
    from fleetgate.gateway.costpage.routes import costpage_router
    from fleetgate.gateway.tenancy.routes import usage_router
    from fleetgate.gateway.tenancy.stage import TenancyStage

    tenancy = next((s for s in (stages.accountant, stages.limiter, stages.auth) if isinstance(s, TenancyStage)), None)
    if tenancy is None:  # tenancy stages replaced by the caller: no usage API to serve
        return []
    return [usage_router(tenancy=tenancy), costpage_router(auth_required=tenancy.auth_enabled)]
