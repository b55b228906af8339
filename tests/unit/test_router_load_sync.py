"""Gateway replicas share their in-flight counts through the store (`fleetgate.router.load_sync`, issue 24)."""

from __future__ import annotations

import asyncio

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.core.kvstore import MemoryKVStore, RedisKVStore
from fleetgate.core.types import Endpoint
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig, preset
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.scheduler import PluginScheduler
from fleetgate.router.types import RoutingRequest

from .test_prefill_queue_scorer import Clock
from .test_prefill_sync import DyingStore

EPS = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="m") for i in range(2)]


def req(rid: str) -> RoutingRequest:
    return RoutingRequest(request_id=rid, model="m", prompt_text=f"{rid} some words")


def least_loaded(store: MemoryKVStore, clock: Clock, seed: int, *, shared: bool | str = True) -> PluginScheduler:
    """The least-loaded preset (the inflight scorer alone) of one replica, its in-flight counts shared or not."""
    data = preset("least-loaded").model_dump(by_alias=True, mode="json")
    cfg = RoutingConfig.model_validate({**data, "loadSync": {"shared": shared}})
    return build_scheduler(cfg, kvstore=store, scrape=False, seed=seed, clock=clock)


async def replicas(store: MemoryKVStore, clock: Clock) -> tuple[PluginScheduler, PluginScheduler]:
    """Two replicas sharing `store`, past their first sync (which only skips the log's possibly old backlog)."""
    a, b = least_loaded(store, clock, 1), least_loaded(store, clock, 2)
    assert await a.sync_now() and await b.sync_now()
    return a, b


async def test_a_replica_balances_against_the_requests_the_other_has_in_flight() -> None:
    """A sent three requests to e0. B, after one sync each, places its next three on e1. Before the counts were
    shared B saw e0 as empty until the engines' next scrape and, balancing its own requests only, sent one of its
    three to e0 whatever the tie-break (the herd of issue 24: both replicas pile onto the same engine)."""
    store, clock = MemoryKVStore(), Clock()
    a, b = await replicas(store, clock)
    for i in range(3):
        a.on_start(req(f"a{i}"), EPS[0])
    assert await a.sync_now() and await b.sync_now()
    assert b.state.load("e0") == 3.0 and b.state.load("e1") == 0.0
    for i in range(3):
        d = await b.pick(req(f"b{i}"), EPS)
        assert d.endpoint.id == "e1"
        b.on_start(req(f"b{i}"), d.endpoint)
    for i in range(3):
        a.on_complete(req(f"a{i}"), EPS[0], ok=True, usage=None)
    assert await a.sync_now() and await b.sync_now()
    assert b.state.load("e0") == 0.0 and b.state.load("e1") == 3.0  # A's requests ended: B stops counting them
    await a.aclose(), await b.aclose()


async def test_without_sharing_a_replica_sees_only_its_own_requests() -> None:
    store, clock = MemoryKVStore(), Clock()
    a, b = least_loaded(store, clock, 1, shared=False), least_loaded(store, clock, 2, shared=False)
    assert a.load_sync is None and b.state.others is None
    for i in range(3):
        a.on_start(req(f"a{i}"), EPS[0])
    assert await a.sync_now() and await b.sync_now()
    assert b.state.load("e0") == 0.0


def test_load_counts_own_shared_and_unaccounted_requests_once() -> None:
    """load = own now + the others' shared counts now + what the engine reported at the last scrape beyond the
    replicas' counts then (requests of no sharing replica): nobody's request is counted twice."""
    others = {"e0": 3.0}
    state = FleetState(clock=Clock())
    state.others = lambda: others
    state.started("e0"), state.started("e0")
    assert state.load("e0") == 5.0  # never scraped: own 2 + others 3
    state.update("e0", waiting=1, running=6, kv_usage=0.1)  # 7 at the engine: 2 own + 3 others + 2 from elsewhere
    assert state.load("e0") == 7.0
    others["e0"] = 5.0  # the other replicas sent two more since the scrape: seen without waiting for the next one
    assert state.load("e0") == 9.0
    del others["e0"]
    assert state.load("e0") == 4.0
    alone = FleetState(clock=Clock())  # not shared: the scrape stands for every other replica, as before
    alone.started("e0"), alone.started("e0")
    alone.update("e0", waiting=1, running=6, kv_usage=0.1)
    assert alone.load("e0") == 2.0 + (7 - 2)


async def test_a_dead_store_fails_open_and_the_others_counts_age_out() -> None:
    store, clock = DyingStore(), Clock()
    a, b = await replicas(store, clock)
    a.on_start(req("a0"), EPS[0])
    assert await a.sync_now() and await b.sync_now()
    assert b.state.load("e0") == 1.0
    store.dead = True
    assert await b.sync_now() is False
    d = await b.pick(req("b0"), EPS)  # decisions go on, on the last-known counts
    assert d.endpoint.id == "e1"
    clock.t += 2.5  # past maxAgeS (2 s)
    assert b.state.load("e0") == 0.0  # A's counts are no longer trusted


def test_sharing_follows_the_store_by_default() -> None:
    redis = RedisKVStore("redis://127.0.0.1:9")  # never reached: the sync starts at the first decision
    cases = [(None, "auto", False), (MemoryKVStore(), "auto", False), (redis, "auto", True), (redis, True, True),
             (MemoryKVStore(), True, True), (None, True, False), (redis, False, False)]
    for kvstore, shared, on in cases:
        cfg = RoutingConfig.model_validate({"loadSync": {"shared": shared}})
        sched = build_scheduler(cfg, kvstore=kvstore, scrape=False)
        assert (sched.load_sync is not None) is on, (kvstore, shared)
        assert (sched.state.others is not None) is on
    assert RoutingConfig().load_sync.shared == "auto" and RoutingConfig().load_sync.interval_s == 0.02


@pytest.mark.parametrize("load_sync", [{"shared": "yes"}, {"intervalS": 0}, {"maxAgeS": -1}, {"every": 1}])
def test_bad_load_sync_settings_are_config_errors(load_sync: dict[str, object]) -> None:
    from fleetgate.core.config import parse_model

    with pytest.raises(ConfigError):
        parse_model(RoutingConfig, {"loadSync": load_sync})


async def test_the_background_sync_starts_with_the_first_decision_and_stops_with_the_scheduler() -> None:
    store = MemoryKVStore()
    a = build_scheduler(RoutingConfig.model_validate({"loadSync": {"shared": True, "intervalS": 0.01}}),
                        kvstore=store, scrape=False, seed=1)
    b = build_scheduler(RoutingConfig.model_validate({"loadSync": {"shared": True, "intervalS": 0.01}}),
                        kvstore=store, scrape=False, seed=2)
    try:
        await a.pick(req("warm-a"), EPS)
        await b.pick(req("warm-b"), EPS)
        a.on_start(req("a0"), EPS[1])
        await asyncio.sleep(0.1)
        assert b.state.load("e1") == 1.0
    finally:
        await a.aclose()
        await b.aclose()
    assert a.load_sync is not None and a.load_sync._task is not None and a.load_sync._task.done()
