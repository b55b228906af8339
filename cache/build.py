"""`build_cache(config, *, kvstore, registry)`: the gateway's one entry point into the cache package."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from fleetgate.cache.config import CacheConfig
from fleetgate.cache.embedding import Embedder, HashingEmbedder, MiniLMEmbedder
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import NoCache, ResponseCache
from fleetgate.core.kvstore import KVStore


def build_embedder(config: CacheConfig) -> Embedder:
    sem = config.semantic
    if sem.embedder == "hashing":
        return HashingEmbedder()
    return MiniLMEmbedder(model_dir=Path(sem.model_dir) if sem.model_dir else None, threads=sem.embed_threads)


def build_cache(
    config: CacheConfig | None,
    *,
    kvstore: KVStore,
    registry: CollectorRegistry | None = None,
    embedder: Embedder | None = None,
) -> ResponseCache:
    """The configured cache; `NoCache` when disabled. MiniLM loads lazily, on the first semantic lookup."""
    config = config or CacheConfig()
    if not config.enabled:
        return NoCache()
    if embedder is None and config.semantic.enabled:
        embedder = build_embedder(config)
    metrics = CacheMetrics(registry if registry is not None else CollectorRegistry())
    return TwoLayerCache(config=config, kvstore=kvstore, metrics=metrics, embedder=embedder)
