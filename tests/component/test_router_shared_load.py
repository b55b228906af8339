"""Two gateway replicas' schedulers see each other's in-flight requests through a real Redis (issue 24,
`fleetgate.router.load_sync`), and a dead or stalled Redis never delays a decision."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator

import pytest

from fleetgate.core.kvstore import RedisKVStore
from fleetgate.core.localredis import LocalRedis
from fleetgate.core.types import Endpoint
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig
from fleetgate.router.scheduler import PluginScheduler
from fleetgate.router.types import RoutingRequest

EPS = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="m") for i in range(2)]


def req(rid: str) -> RoutingRequest:
    return RoutingRequest(request_id=rid, model="m", prompt_text=f"{rid} a short unique prompt")


def shipped_default(store: RedisKVStore, seed: int, **load_sync: object) -> PluginScheduler:
    """The shipped default profile on a Redis store: its in-flight counts shared by default (`shared: auto`)."""
    cfg = RoutingConfig.model_validate({"loadSync": load_sync}) if load_sync else RoutingConfig()
    return build_scheduler(cfg, kvstore=store, scrape=False, seed=seed, namespace="t")


@contextlib.asynccontextmanager
async def two_replicas(url: str, **load_sync: object) -> AsyncIterator[tuple[PluginScheduler, PluginScheduler]]:
    """Replicas A and B on one Redis, their background syncs started; closed with their stores."""
    async with contextlib.AsyncExitStack() as stack:
        pair = []
        for seed in (1, 2):
            store = RedisKVStore(url, socket_timeout_s=0.1)
            stack.push_async_callback(store.close)
            sched = shipped_default(store, seed, **load_sync)
            stack.push_async_callback(sched.aclose)  # closed before its store (callbacks run last in, first out)
            warm = req(f"warm-{seed}")
            sched.on_complete(warm, (await sched.pick(warm, EPS)).endpoint, ok=True, usage=None)
            pair.append(sched)
        await asyncio.sleep(0.1)  # the first syncs (which skip the log's backlog) are done
        yield pair[0], pair[1]


async def test_the_shipped_default_shares_in_flight_counts_between_replicas(redis_url: str) -> None:
    async with two_replicas(redis_url) as (a, b):
        assert a.load_sync is not None and b.load_sync is not None
        for i in range(4):
            a.on_start(req(f"a{i}"), EPS[0])
        await asyncio.sleep(0.1)  # a few 20 ms intervals
        assert b.state.inflight == {} and b.state.load("e0") == 4.0
        for i in range(3):  # B balances against A's requests: its own go to e1
            d = await b.pick(req(f"b{i}"), EPS)
            assert d.endpoint.id == "e1"
            b.on_start(req(f"b{i}"), d.endpoint)
        for i in range(4):
            a.on_complete(req(f"a{i}"), EPS[0], ok=True, usage=None)
        await asyncio.sleep(0.1)
        assert b.state.load("e0") == 0.0 and a.state.load("e1") == 3.0


@pytest.fixture
async def own_redis() -> AsyncIterator[LocalRedis]:
    """A redis-server of this test's own, which it kills or stops."""
    server = LocalRedis().start()
    yield server
    server.stop()


async def test_a_dead_replica_ages_out_and_a_dead_store_fails_open(own_redis: LocalRedis) -> None:
    async with two_replicas(own_redis.url, maxAgeS=0.5) as (a, b):
        a.on_start(req("a0"), EPS[0])
        await asyncio.sleep(0.1)
        assert b.state.load("e0") == 1.0
        await a.aclose()  # replica A dies with its request in flight: it never writes its empty map
        await asyncio.sleep(0.8)
        assert b.state.load("e0") == 0.0  # past maxAgeS: no longer trusted

        b.on_start(req("b0"), EPS[1])
        own_redis.kill()  # the store dies under B: decisions go on, at once, on B's own counts
        await asyncio.sleep(0.2)
        loop = asyncio.get_running_loop()
        for i in range(5):
            t0 = loop.time()
            d = await b.pick(req(f"q{i}"), EPS)
            assert loop.time() - t0 < 0.05
            assert d.endpoint.id == "e0"  # B's own request holds e1
            b.on_start(req(f"q{i}"), d.endpoint)
            b.on_complete(req(f"q{i}"), d.endpoint, ok=True, usage=None)


async def test_a_stalled_store_neither_delays_decisions_nor_keeps_stale_counts(own_redis: LocalRedis) -> None:
    """Redis stops answering (SIGSTOP: the socket stays open, nothing comes back): decisions go on at once, the
    other replica's counts age out, and sharing resumes when Redis answers again."""
    assert own_redis.pid is not None
    async with two_replicas(own_redis.url, maxAgeS=0.5) as (a, b):
        for i in range(3):
            a.on_start(req(f"a{i}"), EPS[0])
        await asyncio.sleep(0.1)
        assert b.state.load("e0") == 3.0
        os.kill(own_redis.pid, signal.SIGSTOP)
        try:
            loop = asyncio.get_running_loop()
            for i in range(5):
                t0 = loop.time()
                d = await b.pick(req(f"q{i}"), EPS)
                assert loop.time() - t0 < 0.05  # no decision waits on the stalled store
                b.on_complete(req(f"q{i}"), d.endpoint, ok=True, usage=None)
            await asyncio.sleep(0.8)  # past maxAgeS with every sync timing out
            assert b.state.load("e0") == 0.0
        finally:
            os.kill(own_redis.pid, signal.SIGCONT)
        await asyncio.sleep(0.5)  # both replicas sync again
        assert b.state.load("e0") == 3.0
