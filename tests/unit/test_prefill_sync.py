"""Queued prefill shared between gateway replicas through the store log (`fleetgate.router.prefill_sync`)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.core.kvstore import MemoryKVStore, StoreUnavailableError
from fleetgate.core.types import Endpoint
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.plugins.base import CACHED_SHARE
from fleetgate.router.plugins.prefill_queue_scorer import PrefillQueueScorer
from fleetgate.router.prefill_sync import PrefillQueueSync
from fleetgate.router.scheduler import PluginScheduler
from fleetgate.router.types import RoutingRequest

from .test_prefill_queue_scorer import Clock

EPS = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="m") for i in range(2)]


class DyingStore(MemoryKVStore):
    """The in-memory store, until `dead` is set: then every call raises as a lost Redis does."""

    def __init__(self) -> None:
        super().__init__()
        self.dead = False

    async def log_append(self, log: str, value: bytes, *, max_len: int | None = None) -> str:
        if self.dead:
            raise StoreUnavailableError("down")
        return await super().log_append(log, value, max_len=max_len)

    async def log_read(self, log: str, *, after: str = "0", count: int = 1000) -> list[tuple[str, bytes]]:
        if self.dead:
            raise StoreUnavailableError("down")
        return await super().log_read(log, after=after, count=count)


def req(rid: str, chars: int) -> RoutingRequest:
    return RoutingRequest(request_id=rid, model="m", prompt_text="x" * chars)


def pair(store: MemoryKVStore, clock: Clock) -> tuple[PrefillQueueSync, PrefillQueueSync]:
    return (PrefillQueueSync(kvstore=store, replica_id="a", clock=clock),
            PrefillQueueSync(kvstore=store, replica_id="b", clock=clock))


async def test_a_replica_reads_the_others_maps_and_not_its_own() -> None:
    store, clock = MemoryKVStore(), Clock()
    a, b = pair(store, clock)
    assert await a.sync({}) and await b.sync({})  # first reads: the (empty) backlog
    await a.sync({"e0": 1_000.0})
    await b.sync({"e1": 300.0})
    assert b.others() == {"e0": 1_000.0}
    await a.sync({"e0": 1_000.0})
    assert a.others() == {"e1": 300.0}
    await a.sync({})  # A's queue drained: it writes the empty map once
    await b.sync({"e1": 300.0})
    assert b.others() == {}
    writes = len(await store.log_read(a.log_key))
    await a.sync({})
    assert len(await store.log_read(a.log_key)) == writes  # an idle replica writes nothing more


async def test_a_replica_that_stops_writing_stops_counting_after_max_age() -> None:
    store, clock = MemoryKVStore(), Clock()
    a, b = pair(store, clock)
    await a.sync({}), await b.sync({})
    await a.sync({"e0": 2_000.0})
    await b.sync({})
    assert b.others() == {"e0": 2_000.0}
    clock.t += 1.9
    await b.sync({})  # A died: nothing new in the log
    assert b.others() == {"e0": 2_000.0}
    clock.t += 0.2
    assert b.others() == {}


async def test_a_new_replica_ignores_the_backlog_which_may_be_old() -> None:
    store, clock = MemoryKVStore(), Clock()
    dead = PrefillQueueSync(kvstore=store, replica_id="dead", clock=clock)
    await dead.sync({"e0": 5_000.0})  # written, say, an hour ago by a replica since gone
    live = PrefillQueueSync(kvstore=store, replica_id="live", clock=clock)
    newcomer = PrefillQueueSync(kvstore=store, replica_id="new", clock=clock)
    await newcomer.sync({})
    assert newcomer.others() == {}
    await live.sync({"e1": 700.0})  # live replicas rewrite their maps every interval
    await newcomer.sync({})
    assert newcomer.others() == {"e1": 700.0}


async def test_a_dead_store_fails_open_and_the_sync_recovers() -> None:
    store, clock = DyingStore(), Clock()
    a = PrefillQueueSync(kvstore=store, replica_id="a", clock=clock)
    b = PrefillQueueSync(kvstore=store, replica_id="b", clock=clock)
    await a.sync({}), await b.sync({})
    await a.sync({"e0": 1_000.0})
    await b.sync({})
    store.dead = True
    assert await b.sync({"e1": 10.0}) is False
    assert b.others() == {"e0": 1_000.0}  # last-known, until it is max_age old
    clock.t += 2.5
    assert await b.sync({}) is False and b.others() == {}
    store.dead = False
    assert await a.sync({"e0": 400.0}) and await b.sync({})
    assert b.others() == {}  # the read after a long gap only moves the cursor
    await a.sync({"e0": 400.0})
    await b.sync({})
    assert b.others() == {"e0": 400.0}


async def test_malformed_entries_are_skipped() -> None:
    store, clock = MemoryKVStore(), Clock()
    a, b = pair(store, clock)
    await b.sync({})
    for raw in (b"not json", b'{"r": "x"}', b'{"r": "y", "q": {"e0": "lots"}}', b"[1]"):
        await store.log_append(b.log_key, raw)
    await a.sync({"e1": 50.0})
    await b.sync({})
    assert b.others() == {"e1": 50.0}


def shared_scheduler(
    store: MemoryKVStore, seed: int, **parameters: object
) -> tuple[PluginScheduler, PrefillQueueScorer]:
    cfg = RoutingConfig.model_validate({
        "plugins": [{"type": "prefill-queue-scorer", "name": "prefill",
                     "parameters": {"shared": True, "includeOwn": False, **parameters}},
                    {"type": "max-score-picker", "name": "pick"}],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "prefill"}, {"pluginRef": "pick"}]}],
    })
    sched = build_scheduler(cfg, kvstore=store, scrape=False, seed=seed)
    [plugin] = sched.profile.first_token
    assert isinstance(plugin, PrefillQueueScorer) and plugin.sync is not None
    return sched, plugin


async def test_two_schedulers_route_around_each_others_queued_prefill() -> None:
    store = MemoryKVStore()
    a, scorer_a = shared_scheduler(store, 1)
    b, scorer_b = shared_scheduler(store, 2)
    try:
        await a.pick(req("warm-a", 100), EPS)  # the first decision starts each replica's background sync
        await b.pick(req("warm-b", 100), EPS)
        long = req("long", 8_192 * 4)
        a.on_start(long, EPS[0])
        await asyncio.sleep(0.2)  # a few 50 ms intervals
        assert scorer_b.queued == {} and scorer_b.sync is not None and scorer_b.sync.others() == {"e0": 8_192.0}
        for i in range(4):
            d = await b.pick(req(f"b{i}", 4_000), EPS)
            assert d.endpoint.id == "e1"
        a.on_first_token(long, EPS[0])
        await asyncio.sleep(0.2)
        assert scorer_b.sync.others() == {}
        assert scorer_a.sync is not None and scorer_a.sync.replica_id != scorer_b.sync.replica_id
    finally:
        await a.aclose()
        await b.aclose()
    assert scorer_a._sync_task is not None and scorer_a._sync_task.done()


def test_sharing_follows_the_store_by_default() -> None:
    from fleetgate.core.kvstore import RedisKVStore

    redis = RedisKVStore("redis://127.0.0.1:9")  # never reached: the sync starts at the first decision
    # the default is auto: on with Redis, off in memory
    cases = [(None, None, False), (MemoryKVStore(), None, False), (redis, None, True),
             (redis, "auto", True), (MemoryKVStore(), "auto", False), (redis, True, True), (None, True, False),
             (redis, False, False)]
    for kvstore, shared, on in cases:
        data = RoutingConfig().model_dump(by_alias=True, mode="json")
        if shared is not None:
            [spec] = [p for p in data["plugins"] if p["type"] == "prefill-queue-scorer"]
            spec["parameters"] = {**(spec.get("parameters") or {}), "shared": shared}
        sched = build_scheduler(RoutingConfig.model_validate(data), kvstore=kvstore, scrape=False)
        [plugin] = [p for p in sched.profile.first_token if isinstance(p, PrefillQueueScorer)]
        assert (plugin.sync is not None) is on, (kvstore, shared)


@pytest.mark.parametrize("parameters", [{"shared": "yes"}, {"syncIntervalS": 0}, {"syncMaxAgeS": -1}])
def test_bad_sync_parameters_are_config_errors(parameters: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        shared_scheduler(MemoryKVStore(), 1, **parameters)


def test_without_a_sync_the_scorer_counts_its_own_queue_only() -> None:
    s = PrefillQueueScorer(name="p", state=FleetState(clock=Clock()), include_own=False)
    s.on_start(req("r", 4_000), {}, EPS[0])
    assert s.score(req("q", 100), {}, EPS) == pytest.approx([1 - 1_000 / 2048, 1.0])


async def test_a_replica_whose_prompts_are_all_warm_still_shares_its_queue() -> None:
    """With warmShare the scorer abstains for warm prompts; the sync must start anyway: those prompts' uncached
    tails are queued prefill the other replicas should count."""
    store, clock = MemoryKVStore(), Clock()
    sync = PrefillQueueSync(kvstore=store, replica_id="a", clock=clock)
    s = PrefillQueueScorer(name="p", state=FleetState(clock=clock), warm_share=0.5, sync=sync)
    warm = {CACHED_SHARE: {"e0": 0.9, "e1": 0.0}}
    assert s.score(req("w", 8_000), warm, EPS) == [1.0, 1.0]
    s.on_start(req("w", 8_000), warm, EPS[0])
    await asyncio.sleep(0.1)
    await s.aclose()
    [(_, raw)] = (await store.log_read(sync.log_key))[-1:]
    assert orjson.loads(raw) == {"r": "a", "q": {"e0": 200.0}}
