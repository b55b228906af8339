"""Two gateway replicas' schedulers agree on prefix affinity through a real Redis."""

from __future__ import annotations

import asyncio

from fleetgate.core.kvstore import RedisKVStore
from fleetgate.core.types import Endpoint
from fleetgate.router.build import build_scheduler
from fleetgate.router.types import RoutingRequest

EPS = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="m") for i in range(4)]
SYSTEM = "Shared system prompt of tenant acme. " * 120


def req(i: int, text: str) -> RoutingRequest:
    return RoutingRequest(request_id=f"r{i}", model="m", prompt_text=text)


async def test_replica_b_routes_to_where_replica_a_sent_the_prefix(redis_url: str) -> None:
    store_a, store_b = RedisKVStore(redis_url), RedisKVStore(redis_url)
    a = build_scheduler(kvstore=store_a, scrape=False, seed=1, namespace="t")
    b = build_scheduler(kvstore=store_b, scrape=False, seed=2, namespace="t")
    try:
        first = await a.pick(req(0, SYSTEM + "first question"), EPS)
        a.on_start(req(0, SYSTEM + "first question"), first.endpoint)
        a.on_complete(req(0, SYSTEM + "first question"), first.endpoint, ok=True, usage=None)
        await a.pick(req(1, "unrelated short prompt " * 30), EPS)  # A's producer flushes its records
        await asyncio.sleep(0.15)  # > 2 x the 50 ms sync interval
        await b.pick(req(2, "another unrelated prompt " * 30), EPS)  # B's producer pulls the log
        await asyncio.sleep(0.15)
        picks = set()
        for i in range(8):
            d = await b.pick(req(10 + i, SYSTEM + f"question {i} from a client of replica B"), EPS)
            picks.add(d.endpoint.id)
            assert d.reasons["prefix"] > 1.5
        assert picks == {first.endpoint.id}
    finally:
        await a.aclose()
        await b.aclose()
        await store_a.close()
        await store_b.close()


async def test_store_outage_fails_open() -> None:
    store = RedisKVStore("redis://127.0.0.1:1/0", socket_timeout_s=0.05)
    sched = build_scheduler(kvstore=store, scrape=False, seed=1)
    try:
        chosen = set()
        for i in range(4):
            r = req(i, SYSTEM + f"q{i}")
            d = await sched.pick(r, EPS)
            sched.on_start(r, d.endpoint)
            sched.on_complete(r, d.endpoint, ok=True, usage=None)
            chosen.add(d.endpoint.id)
            await asyncio.sleep(0.06)  # let the failing background sync run
        assert len(chosen) == 1  # the local index kept the affinity while Redis is down
        assert d.reasons["prefix"] > 1.5
    finally:
        await sched.aclose()
        await store.close()
