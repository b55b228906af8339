"""`build_cache(config, *, kvstore, registry)`: the gateway's one entry point into the cache package."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from fleetgate.cache.config import CacheConfig
from fleetgate.cache.embedding import (
    BatchingEmbedder,
    Embedder,
    HashingEmbedder,
    MiniLMEmbedder,
    OnnxMiniLMEmbedder,
    serves_minilm,
)
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import NoCache, ResponseCache
from fleetgate.core.kvstore import KVStore
from fleetgate.core.minilm_export import OnnxVariant


def build_embedder(config: CacheConfig, *, metrics: CacheMetrics | None = None,
                   endpoints: Callable[[], Sequence[str]] | None = None) -> Embedder:
    """The configured embedder; a MiniLM one is wrapped in the micro-batcher and loads on first use.
    `endpoints`: the encoder service's base URLs from discovery (`semantic.embedder: remote` without a `url`)."""
    sem = config.semantic
    if sem.embedder == "hashing":
        return HashingEmbedder()
    model_dir = Path(sem.model_dir) if sem.model_dir else None
    if sem.embedder == "remote":
        from fleetgate.cache.remote_encoder import RemoteEncoder

        remote = sem.remote
        encoder = RemoteEncoder(config=remote, endpoints=endpoints, model_dir=model_dir,
                                metrics=metrics.encoder if metrics is not None else None)
        return BatchingEmbedder(embedder=encoder, max_batch=remote.batch_max, max_wait_s=remote.batch_wait_ms / 1000,
                                preload=True, memo_entries=sem.embed_memo, max_in_flight=remote.max_in_flight,
                                timeout_s=encoder.timeout_s)  # preload: only the tokenizer, no request
    inner: MiniLMEmbedder | OnnxMiniLMEmbedder
    if sem.embedder == "minilm":
        inner = MiniLMEmbedder(model_dir=model_dir, threads=sem.embed_threads)
    else:
        variant: OnnxVariant = "int8" if sem.embedder == "minilm-onnx-int8" else "fp32"
        inner = OnnxMiniLMEmbedder(model_dir=model_dir, variant=variant, intra_op_threads=sem.embed_threads)
    return BatchingEmbedder(embedder=inner, max_batch=sem.batch_max, max_wait_s=sem.batch_wait_ms / 1000,
                            preload=sem.preload, memo_entries=sem.embed_memo)


def build_cache(
    config: CacheConfig | None,
    *,
    kvstore: KVStore,
    registry: CollectorRegistry | None = None,
    embedder: Embedder | None = None,
    endpoints: Callable[[], Sequence[str]] | None = None,
) -> ResponseCache:
    """The configured cache; `NoCache` when disabled. MiniLM loads lazily, on the first semantic lookup
    (at start-up with `semantic.preload`). `endpoints`: see `build_embedder`."""
    config = config or CacheConfig()
    if not config.enabled:
        return NoCache()
    metrics = CacheMetrics(registry if registry is not None else CollectorRegistry())
    if embedder is None and config.semantic.enabled:
        embedder = build_embedder(config, metrics=metrics, endpoints=endpoints)
    return TwoLayerCache(config=config, kvstore=kvstore, metrics=metrics, embedder=embedder,
                         prefilter=build_prefilter(config, embedder))


def build_prefilter(config: CacheConfig, embedder: Embedder | None) -> Embedder | None:
    """The static prefilter's embedder: MiniLM's static token table, for a MiniLM encoder, in this process or
    a service (its table is distilled from that model); None when off or with another encoder (the hashing one
    of the tests)."""
    if config.semantic.prefilter != "static" or embedder is None or not serves_minilm(embedder):
        return None
    from fleetgate.core.minilm_static import StaticMiniLM

    sem = config.semantic
    return StaticMiniLM(model_dir=Path(sem.model_dir) if sem.model_dir else None)
