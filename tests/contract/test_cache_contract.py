"""The response cache's behaviour on every store backend: in memory and a real Redis server.

A deterministic hashing embedder stands in for MiniLM (the real model is exercised in
tests/component/test_cache_minilm.py); the threshold is lowered to suit it.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fleetgate.cache.build import build_cache
from fleetgate.cache.config import CacheConfig, SemanticConfig
from fleetgate.cache.embedding import HashingEmbedder
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import CacheRequest, CacheStatus
from fleetgate.core.kvstore import KVStore, MemoryKVStore, RedisKVStore

Q = "In Python, how do I reverse a string?"
Q_REORDERED = "How do I reverse a string in Python?"


def chat(last: str, *, system: str = "You are helpful.", history: list[dict[str, str]] | None = None,
         **params: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, *(history or []), {"role": "user", "content": last}]
    return {"model": "m", "messages": messages, "temperature": 0, **params}


def request(body: dict[str, Any], *, tenant: str = "t1", model: str = "m", **flags: bool) -> CacheRequest:
    return CacheRequest(tenant=tenant, model=model, kind="chat", body=body, **flags)


def answer(text: str = "Use slicing: s[::-1].", finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-engine-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30},
    }


def config(**overrides: Any) -> CacheConfig:
    semantic = SemanticConfig(embedder="hashing", threshold=0.5)
    return CacheConfig(semantic=semantic, key_prefix="ct:", **overrides)


@pytest.fixture(params=["memory", "redis"])
async def kv(request: pytest.FixtureRequest) -> AsyncIterator[KVStore]:
    store: KVStore = MemoryKVStore() if request.param == "memory" else RedisKVStore(
        request.getfixturevalue("redis_url"), prefix="cachecontract:")
    yield store
    await store.close()


def make(kv: KVStore, **overrides: Any) -> TwoLayerCache:
    cache = build_cache(config(**overrides), kvstore=kv, registry=CollectorRegistry(), embedder=HashingEmbedder())
    assert isinstance(cache, TwoLayerCache)
    return cache


async def remember(cache: TwoLayerCache, req: CacheRequest, response: dict[str, Any] | None = None) -> None:
    first = await cache.lookup(req)
    assert first.status == CacheStatus.MISS, first.reason
    await cache.store(req, first, response or answer())


async def test_exact_hit_replays_the_answer_with_fresh_id_and_original_usage(kv: KVStore) -> None:
    cache = make(kv)
    await remember(cache, request(chat(Q)))
    hit = await cache.lookup(request(chat(Q)))
    assert hit.status == CacheStatus.HIT_EXACT
    assert hit.response is not None
    assert hit.response["choices"][0]["message"]["content"] == "Use slicing: s[::-1]."
    assert hit.response["usage"] == answer()["usage"]
    assert hit.response["id"] != "chatcmpl-engine-1" and hit.response["id"].startswith("chatcmpl-")
    again = await cache.lookup(request(chat(Q)))
    assert again.response is not None and again.response["id"] != hit.response["id"]


async def test_exact_key_ignores_body_key_order_and_transport_fields(kv: KVStore) -> None:
    cache = make(kv)
    await remember(cache, request(chat(Q)))
    body = dict(reversed(list(chat(Q, stream=True, user="alice").items())))
    assert (await cache.lookup(request(body))).status == CacheStatus.HIT_EXACT


async def test_semantic_hit_within_the_partition(kv: KVStore) -> None:
    cache = make(kv)
    await remember(cache, request(chat(Q)))
    hit = await cache.lookup(request(chat(Q_REORDERED)))
    assert hit.status == CacheStatus.HIT_SEMANTIC, hit.reason
    assert hit.similarity is not None and 0.5 <= hit.similarity < 1.0
    assert hit.embedding is not None


@pytest.mark.parametrize(
    ("name", "other"),
    [
        ("tenant", request(chat(Q_REORDERED), tenant="t2")),
        ("model", request(chat(Q_REORDERED), model="m-large")),
        ("system prompt", request(chat(Q_REORDERED, system="You answer in French."))),
        ("max_tokens", request(chat(Q_REORDERED, max_tokens=5))),
        ("response_format", request(chat(Q_REORDERED, response_format={"type": "json_object"}))),
        ("earlier turns", request(chat(Q_REORDERED, history=[{"role": "user", "content": "I use Go."},
                                                              {"role": "assistant", "content": "OK."}]))),
    ],
)
async def test_no_hit_crosses_a_partition(kv: KVStore, name: str, other: CacheRequest) -> None:
    cache = make(kv)
    await remember(cache, request(chat(Q)))
    exact_twin = copy.deepcopy(other)
    exact_twin.body["messages"][-1]["content"] = Q  # type: ignore[index]
    for probe in (other, exact_twin):
        result = await cache.lookup(probe)
        assert result.status == CacheStatus.MISS, f"{name}: {result.status} {result.reason}"


async def test_near_miss_is_rejected_by_the_verifier(kv: KVStore) -> None:
    cache = make(kv)
    await remember(cache, request(chat("How do I enable two-factor authentication on my account?")))
    result = await cache.lookup(request(chat("How do I disable two-factor authentication on my account?")))
    assert result.status == CacheStatus.MISS
    assert "near miss rejected" in result.reason


async def test_entries_expire_after_the_ttl(kv: KVStore) -> None:
    cache = make(kv, ttl_s=0.2)
    await remember(cache, request(chat(Q)))
    assert (await cache.lookup(request(chat(Q)))).status == CacheStatus.HIT_EXACT
    await asyncio.sleep(0.35)
    assert (await cache.lookup(request(chat(Q)))).status == CacheStatus.MISS
    assert (await cache.lookup(request(chat(Q_REORDERED)))).status == CacheStatus.MISS


async def test_size_bound_evicts_the_oldest_first(kv: KVStore) -> None:
    cache = make(kv, max_entries=3)
    prompts = [f"What is the capital city of country number {i}?" for i in range(5)]
    for p in prompts:
        await remember(cache, request(chat(p)))
    statuses = [(await cache.lookup(request(chat(p)))).status for p in prompts]
    assert statuses == [CacheStatus.MISS] * 2 + [CacheStatus.HIT_EXACT] * 3
    assert len(cache.index) == 3
    assert cache.metrics.evictions._value.get() == 2


@pytest.mark.parametrize(
    ("response", "stored"),
    [
        (answer(), True),
        (answer(finish="length"), False),
        (answer(finish="tool_calls"), False),
        (answer(finish="content_filter"), False),
        ({"error": {"message": "boom"}}, False),
        ({"object": "chat.completion", "choices": []}, False),
    ],
)
async def test_only_complete_successful_responses_are_stored(
    kv: KVStore, response: dict[str, Any], stored: bool
) -> None:
    cache = make(kv)
    await remember(cache, request(chat(Q)), response)
    expected = CacheStatus.HIT_EXACT if stored else CacheStatus.MISS
    assert (await cache.lookup(request(chat(Q)))).status == expected


async def test_no_cache_stores_but_does_not_serve_and_no_store_does_neither(kv: KVStore) -> None:
    cache = make(kv)
    fresh = await cache.lookup(request(chat(Q), no_cache=True))
    assert fresh.status == CacheStatus.BYPASS and fresh.reason == "no-cache"
    await cache.store(request(chat(Q), no_cache=True), fresh, answer("first"))
    assert (await cache.lookup(request(chat(Q), no_cache=True))).status == CacheStatus.BYPASS
    hit = await cache.lookup(request(chat(Q)))
    assert hit.status == CacheStatus.HIT_EXACT

    other = "What is the capital of Peru?"
    refused = await cache.lookup(request(chat(other), no_store=True))
    assert refused.status == CacheStatus.BYPASS and refused.reason == "no-store"
    await cache.store(request(chat(other), no_store=True), refused, answer("Lima"))
    assert (await cache.lookup(request(chat(other)))).status == CacheStatus.MISS


async def test_sampled_requests_bypass_unless_the_caller_opts_in(kv: KVStore) -> None:
    cache = make(kv)
    sampled = chat(Q, temperature=0.7)
    result = await cache.lookup(request(sampled))
    assert result.status == CacheStatus.BYPASS and "sampled" in result.reason
    await cache.store(request(sampled), result, answer())
    assert (await cache.lookup(request(sampled, allow_sampled=True))).status == CacheStatus.MISS
    await remember(cache, request(sampled, allow_sampled=True))
    assert (await cache.lookup(request(sampled, allow_sampled=True))).status == CacheStatus.HIT_EXACT
