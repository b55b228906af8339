"""Start-up: the embedder loads in the background; until then only the exact layer serves."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
from prometheus_client import CollectorRegistry

from fleetgate.cache.config import CacheConfig, SemanticConfig
from fleetgate.cache.embedding import HashingEmbedder
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import CacheRequest, CacheStatus
from fleetgate.core.kvstore import MemoryKVStore

from .cache_requests import chat_answer
from .cache_requests import chat_request as req


class SlowLoadingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def load(self) -> None:
        self.release.wait(5)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        assert self.release.is_set(), "embedding before the model was loaded"
        return super().embed(texts)


ANSWER = chat_answer("x")


async def test_semantic_layer_waits_for_the_model_without_blocking_requests() -> None:
    embedder = SlowLoadingEmbedder()
    cache = TwoLayerCache(config=CacheConfig(semantic=SemanticConfig(embedder="hashing", threshold=0.5)),
                          kvstore=MemoryKVStore(), embedder=embedder, metrics=CacheMetrics(CollectorRegistry()))
    await cache.start()
    start = time.perf_counter()
    first = await cache.lookup(req("In Go, how do I sort a slice?"))
    assert first.status == CacheStatus.MISS and first.reason == "semantic layer warming up"
    assert time.perf_counter() - start < 1.0
    embedder.release.set()
    await cache.store(req("In Go, how do I sort a slice?"), first, ANSWER)  # waits for the model, then indexes
    assert len(cache.index.vectors) == 1
    assert (await cache.lookup(req("How do I sort a slice in Go?"))).status == CacheStatus.HIT_SEMANTIC
    await cache.aclose()


async def test_preload_loads_the_verifier_tables_at_start() -> None:
    from fleetgate.cache.wordmatch import zipf

    zipf.cache_clear()
    config = CacheConfig(semantic=SemanticConfig(embedder="hashing", threshold=0.5, preload=True))
    cache = TwoLayerCache(config=config, kvstore=MemoryKVStore(), embedder=HashingEmbedder(),
                          metrics=CacheMetrics(CollectorRegistry()))
    await cache.start()
    await cache.aclose()
    assert zipf.cache_info().currsize > 0  # the word tables were used in the warm-up, not on a request


async def test_without_preload_the_tables_load_on_the_first_semantic_lookup_only() -> None:
    from fleetgate.cache.wordmatch import zipf

    zipf.cache_clear()
    config = CacheConfig(semantic=SemanticConfig(embedder="hashing", threshold=0.5))
    cache = TwoLayerCache(config=config, kvstore=MemoryKVStore(), embedder=HashingEmbedder(),
                          metrics=CacheMetrics(CollectorRegistry()))
    await cache.start()
    sampled = CacheRequest(tenant="t", model="m", kind="chat",
                           body={"messages": [{"role": "user", "content": "hi"}], "temperature": 0.9})
    assert (await cache.lookup(sampled)).status == CacheStatus.BYPASS
    assert zipf.cache_info().currsize == 0  # a bypassing gateway stays small: nothing loaded
    first = await cache.lookup(req("In Go, how do I sort a slice?"))
    assert first.reason == "semantic layer warming up"
    await cache.aclose()  # waits for the warm-up task
    assert zipf.cache_info().currsize > 0
