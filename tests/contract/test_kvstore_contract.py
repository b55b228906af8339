"""One contract suite for every `KVStore` backend: in-memory and a real Redis server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from fleetgate.core.kvstore import KVStore, MemoryKVStore, RedisKVStore, StoreUnavailableError
from fleetgate.core.localredis import free_port


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[KVStore]:
    if request.param == "memory":
        s: KVStore = MemoryKVStore()
    else:
        s = RedisKVStore(request.getfixturevalue("redis_url"), prefix="contract:")
    yield s
    await s.close()


async def test_get_set_delete(store: KVStore) -> None:
    assert await store.get("a") is None
    await store.set("a", b"1")
    assert await store.get("a") == b"1"
    assert await store.mget(["a", "missing"]) == [b"1", None]
    await store.delete("a")
    assert await store.get("a") is None


async def test_ttl_expires(store: KVStore) -> None:
    await store.set("t", b"x", ttl_s=0.05)
    assert await store.get("t") == b"x"
    await asyncio.sleep(0.12)
    assert await store.get("t") is None


async def test_incr_is_atomic_under_concurrency(store: KVStore) -> None:
    await asyncio.gather(*(store.incr("n", 2) for _ in range(50)))
    assert await store.incr("n", 0) == 100


async def test_keys_by_pattern(store: KVStore) -> None:
    await store.set("p:1", b"")
    await store.set("p:2", b"")
    await store.set("q:1", b"")
    assert sorted(await store.keys("p:*")) == ["p:1", "p:2"]


async def test_log_append_and_read_after(store: KVStore) -> None:
    first = await store.log_append("log", b"one")
    await store.log_append("log", b"two")
    assert [v for _, v in await store.log_read("log")] == [b"one", b"two"]
    assert [v for _, v in await store.log_read("log", after=first)] == [b"two"]


async def test_redis_down_raises_store_unavailable() -> None:
    s = RedisKVStore(f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=0.2)
    with pytest.raises(StoreUnavailableError):
        await s.get("x")
    assert await s.ping() is False
    await s.close()
