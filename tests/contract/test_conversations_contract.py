"""The Responses API's stored responses on every `KVStore` backend (in memory, and a real Redis server shared by
replicas): per tenant, expiring, bounded, and a 503 (never a silent 404) when the store cannot be read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from fleetgate.core.kvstore import KVStore, MemoryKVStore, RedisKVStore
from fleetgate.core.localredis import free_port
from fleetgate.gateway.conversations import ConversationStore, StoreDownError, StoredResponse

ITEMS = [{"role": "user", "content": "hi"}, {"type": "message", "role": "assistant",
                                              "content": [{"type": "output_text", "text": "hello"}]}]


@pytest.fixture(params=["memory", "redis"])
async def kv(request: pytest.FixtureRequest) -> AsyncIterator[KVStore]:
    store: KVStore = MemoryKVStore() if request.param == "memory" else RedisKVStore(
        request.getfixturevalue("redis_url"), prefix="conversations:")
    yield store
    await store.close()


async def test_a_stored_response_is_its_tenants_alone(kv: KVStore) -> None:
    store = ConversationStore(kv, ttl_s=60, max_bytes=1 << 20)
    saved = StoredResponse(items=ITEMS, response={"id": "resp_1", "object": "response"}, session="resp_0")
    assert await store.save(tenant="acme", response_id="resp_1", stored=saved)
    assert await store.load(tenant="acme", response_id="resp_1") == saved
    # A second replica reads what the first wrote (one shared store).
    assert await ConversationStore(kv, ttl_s=60, max_bytes=1 << 20).load(tenant="acme", response_id="resp_1") == saved
    assert await store.load(tenant="other", response_id="resp_1") is None
    assert not await store.delete(tenant="other", response_id="resp_1")
    assert await store.delete(tenant="acme", response_id="resp_1")
    assert await store.load(tenant="acme", response_id="resp_1") is None


async def test_stored_responses_expire_and_large_ones_are_not_stored(kv: KVStore) -> None:
    store = ConversationStore(kv, ttl_s=0.1, max_bytes=200)
    assert await store.save(tenant="acme", response_id="r", stored=StoredResponse(items=ITEMS, response={}))
    assert not await store.save(tenant="acme", response_id="big",
                                stored=StoredResponse(items=[{"content": "x" * 300}], response={}))
    assert await store.load(tenant="acme", response_id="big") is None
    await asyncio.sleep(0.25)
    assert await store.load(tenant="acme", response_id="r") is None


async def test_a_store_that_cannot_be_read_is_a_503_not_a_missing_response() -> None:
    down = RedisKVStore(f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=0.2)  # nothing listens there
    store = ConversationStore(down, ttl_s=60, max_bytes=1 << 20)
    with pytest.raises(StoreDownError) as err:
        await store.load(tenant="acme", response_id="resp_1")
    assert err.value.status == 503
    assert not await store.save(tenant="acme", response_id="resp_1", stored=StoredResponse(items=[], response={}))
    await down.close()
