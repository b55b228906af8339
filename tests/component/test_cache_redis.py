"""The cache over a real Redis: replicas share entries, and a Redis outage turns caching off and back on."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fleetgate.cache.config import CacheConfig, SemanticConfig
from fleetgate.cache.embedding import HashingEmbedder
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import CacheRequest, CacheStatus
from fleetgate.core.kvstore import RedisKVStore
from fleetgate.core.localredis import LocalRedis

pytestmark = pytest.mark.redis

Q = "In Python, how do I reverse a string?"
Q2 = "How do I reverse a string in Python?"


def req(text: str) -> CacheRequest:
    return CacheRequest(tenant="t", model="m", kind="chat",
                        body={"messages": [{"role": "user", "content": text}], "temperature": 0})


ANSWER: dict[str, Any] = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "s[::-1]"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16},
}


def replica(url: str, **overrides: Any) -> TwoLayerCache:
    config = CacheConfig(semantic=SemanticConfig(embedder="hashing", threshold=0.5, sync_interval_s=0.0),
                         backend_retry_s=0.1, **overrides)
    return TwoLayerCache(config=config, kvstore=RedisKVStore(url, prefix="replicas:"), embedder=HashingEmbedder(),
                         metrics=CacheMetrics(CollectorRegistry()))


async def test_two_replicas_share_entries_through_redis(redis_url: str) -> None:
    a, b = replica(redis_url), replica(redis_url)
    miss = await a.lookup(req(Q))
    assert (await b.lookup(req(Q2))).status == CacheStatus.MISS  # b has synced the (empty) log
    await a.store(req(Q), miss, ANSWER)
    assert (await b.lookup(req(Q))).status == CacheStatus.HIT_EXACT
    semantic = await b.lookup(req(Q2))
    assert semantic.status == CacheStatus.HIT_SEMANTIC, semantic.reason
    assert len(b.index) == 1 and len(b.index.vectors) == 1
    late = replica(redis_url)  # a replica that starts later replays the whole log
    assert (await late.lookup(req(Q2))).status == CacheStatus.HIT_SEMANTIC


async def test_size_bound_holds_across_replicas(redis_url: str) -> None:
    a, b = replica(redis_url, max_entries=2), replica(redis_url, max_entries=2)
    texts = [f"What is the tallest mountain on continent number {i}?" for i in range(3)]
    for i, text in enumerate(texts):
        writer = (a, b)[i % 2]
        await writer.sync(force=True)
        await writer.store(req(text), await writer.lookup(req(text)), ANSWER)
    await a.sync(force=True)
    await b.sync(force=True)
    assert list(a.index.order) == list(b.index.order) and len(a.index) == 2
    assert (await a.lookup(req(texts[0]))).status == CacheStatus.MISS  # evicted: the key is gone from Redis
    assert (await b.lookup(req(texts[2]))).status == CacheStatus.HIT_EXACT


async def test_redis_outage_fails_open_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    server = LocalRedis().start()
    port = server.port
    cache = replica(server.url)
    try:
        await cache.store(req(Q), await cache.lookup(req(Q)), ANSWER)
        assert (await cache.lookup(req(Q))).status == CacheStatus.HIT_EXACT
        server.stop()
        with caplog.at_level(logging.WARNING, logger="fleetgate.cache"):
            down = await cache.lookup(req(Q))
        start = time.perf_counter()
        for _ in range(5):  # while down, lookups bypass at once (no connect timeout on the request path)
            assert (await cache.lookup(req(Q2))).status == CacheStatus.BYPASS
            await asyncio.sleep(0.1)
        assert time.perf_counter() - start < 0.5 + 5 * 0.05
        assert down.status == CacheStatus.BYPASS and down.reason == "cache backend unavailable"
        assert cache.metrics.backend_up._value.get() == 0
        assert cache.metrics.backend_errors._value.get() >= 1
        assert any("response cache off" in r.getMessage() for r in caplog.records)
        await cache.store(req(Q), down, ANSWER)  # no exception, nothing stored
        assert (await cache.lookup(req(Q2))).status == CacheStatus.BYPASS

        server = LocalRedis(port=port).start()  # back, and empty
        with caplog.at_level(logging.WARNING, logger="fleetgate.cache"):
            for _ in range(100):  # lookups never wait for the probe: poll until it has seen the store
                back = await cache.lookup(req(Q))
                if back.status != CacheStatus.BYPASS:
                    break
                await asyncio.sleep(0.05)
        assert back.status == CacheStatus.MISS
        assert cache.metrics.backend_up._value.get() == 1
        assert any("response cache back on" in r.getMessage() for r in caplog.records)
        assert len(cache.index) == 0  # the stale index was dropped with the old server's data
        await cache.store(req(Q), back, ANSWER)
        assert (await cache.lookup(req(Q2))).status == CacheStatus.HIT_SEMANTIC
    finally:
        await cache.kv.close()
        server.stop()
