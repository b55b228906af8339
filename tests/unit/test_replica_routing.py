"""Gateway replicas in the virtual fleet (`fleetgate.sim.virtual_fleet`, `fleetgate.bench.replica_routing`) and the
group placement figures (`fleetgate.sim.report.group_split`), issue 24."""

from __future__ import annotations

import pytest

from fleetgate.bench.replica_routing import LoopbackStore, arm_config, run_arm
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig, preset
from fleetgate.sim.profile import get_profile
from fleetgate.sim.report import group_split
from fleetgate.sim.virtual_fleet import VirtualClock, run_virtual_fleet
from fleetgate.sim.workloads import shared_prefix


def test_group_split_counts_switches_in_send_order_and_split_groups() -> None:
    placements = [("g1", "a"), ("g2", "b"), ("g1", "a"), ("g1", "b"), ("g2", "b"), ("g1", "a"), ("g3", "a")]
    # g1: a a b a -> 2 switches of 3 pairs, 1 of 4 off its majority; g2: b b -> none; g3: one request, no pair
    assert group_split(placements) == {"group_switch_share": 2 / 4, "group_off_majority_share": 1 / 7,
                                       "groups_split": 1}
    assert group_split([("g", "a")]) == {"group_switch_share": None, "group_off_majority_share": None,
                                         "groups_split": None}


async def test_replicas_take_requests_in_turn_and_learn_only_of_their_own() -> None:
    items = shared_prefix(seed=3, groups=4, prompts_per_group=6, prefix_tokens=256, question_tokens=16,
                          max_tokens=8, rate_rps=20.0)
    clock = VirtualClock()
    replicas = [build_scheduler(preset("least-loaded"), scrape=False, seed=k, clock=clock) for k in range(2)]
    picks = [0, 0]
    synced: list[tuple[int, float]] = []
    for k, sched in enumerate(replicas):
        real_pick = sched.pick

        async def counting_pick(req, endpoints, _k=k, _pick=real_pick):  # type: ignore[no-untyped-def]
            picks[_k] += 1
            return await _pick(req, endpoints)

        sched.pick = counting_pick  # type: ignore[method-assign]

    async def sync(k: int) -> None:
        synced.append((k, clock()))

    result = await run_virtual_fleet(scheduler=replicas, items=items, replicas=2, profile=get_profile("gpu-8b"),
                                     clock=clock, sync=sync, sync_interval_s=0.1)
    assert picks == [12, 12]  # 24 requests, in turn
    assert sum(result.per_endpoint.values()) == 24 and len(result.placements) == 24
    assert all(s.state.inflight == {} for s in replicas)  # each was told of the end of every request it started
    first = {k: min(t for kk, t in synced if kk == k) for k in (0, 1)}
    assert first == {0: pytest.approx(0.05), 1: pytest.approx(0.1)}  # staggered over the interval
    later = sorted(t for kk, t in synced if kk == 0)
    assert later[1] - later[0] == pytest.approx(0.1)


def test_arms_name_the_replicas_and_what_they_share() -> None:
    cfg = RoutingConfig()
    assert arm_config("1", cfg)[0] == 1
    replicas, noload, shared = arm_config("2-noload", cfg)
    assert (replicas, noload.load_sync.shared, shared) == (2, False, True)
    assert arm_config("3-alone", cfg)[0::2] == (3, False)
    for bad in ("two", "0", "2-sometimes"):
        with pytest.raises(ValueError):
            arm_config(bad, cfg)


def test_the_loopback_store_turns_every_auto_sync_on_as_redis_does() -> None:
    sched = build_scheduler(RoutingConfig(), kvstore=LoopbackStore(), scrape=False)
    assert sched.load_sync is not None
    syncing = [p for p in sched.profile.syncables if getattr(p, "sync", None) is not None]
    assert len(syncing) == 2  # the prefix index and the queued prefill


async def test_a_small_run_of_one_and_of_two_replicas() -> None:
    kw = dict(config=RoutingConfig(), seed=1, rate=8.0, engines=2, kv_blocks=512, groups=6, prompts_per_group=6,
              prefix_tokens=512, sync_interval_s=0.05)
    one = await run_arm("1", **kw)  # type: ignore[arg-type]
    two = await run_arm("2", **kw)  # type: ignore[arg-type]
    assert one["requests"] == two["requests"] == 36
    assert sum(two["per_endpoint"].values()) == 36 and two["group_switch_share"] is not None
    assert 0.0 <= two["hit_rate"] <= 1.0 and two["ttft_p90_s"] >= two["ttft_p50_s"] > 0
