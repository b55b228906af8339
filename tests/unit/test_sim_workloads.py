"""Benchmark workloads are deterministic under a seed and have the documented shape; the virtual
fleet reproduces a run exactly and shows the effect routing is supposed to have."""

from __future__ import annotations

from fleetgate.router.build import build_scheduler
from fleetgate.router.roundrobin import RoundRobinScheduler
from fleetgate.sim.engine import count_tokens
from fleetgate.sim.profile import SimProfile
from fleetgate.sim.virtual_fleet import VirtualClock, run_virtual_fleet
from fleetgate.sim.workloads import multi_round_chat, shared_prefix, unique_prompts


def test_workloads_are_deterministic_under_a_seed() -> None:
    assert shared_prefix(seed=3, groups=4, prompts_per_group=3) == shared_prefix(seed=3, groups=4, prompts_per_group=3)
    assert shared_prefix(seed=3, groups=4, prompts_per_group=3) != shared_prefix(seed=4, groups=4, prompts_per_group=3)
    assert multi_round_chat(seed=3, users=3, rounds=2) == multi_round_chat(seed=3, users=3, rounds=2)
    assert unique_prompts(seed=3, n=10) == unique_prompts(seed=3, n=10)


def test_shared_prefix_shape() -> None:
    items = shared_prefix(seed=1, groups=3, prompts_per_group=5, prefix_tokens=256, question_tokens=32)
    assert len(items) == 15
    by_group: dict[str, list[str]] = {}
    for it in items:
        by_group.setdefault(it.group, []).append(it.prompt)
    assert sorted(len(v) for v in by_group.values()) == [5, 5, 5]
    for prompts in by_group.values():
        head = prompts[0][:1000]
        assert all(p[:1000] == head for p in prompts)  # the long prefix is shared within a group
    assert len({p[:1000] for p in (v[0] for v in by_group.values())}) == 3
    assert 280 <= count_tokens(items[0].prompt, chars_per_token=4) <= 300
    assert [it.arrival_s for it in items] == sorted(it.arrival_s for it in items)


def test_chat_rounds_grow_and_chain() -> None:
    items = multi_round_chat(seed=1, users=2, rounds=3)
    rounds = [it for it in items if it.session_key == "user-0"]
    assert [it.after for it in rounds] == [None, rounds[0].id, rounds[1].id]
    assert rounds[1].prompt.startswith(rounds[0].prompt) and rounds[2].prompt.startswith(rounds[1].prompt)


async def _run(scheduler, items, clock=None):  # type: ignore[no-untyped-def]
    profile = SimProfile(num_blocks=256)
    return await run_virtual_fleet(scheduler=scheduler, items=items, replicas=4, profile=profile, clock=clock)


async def test_virtual_fleet_is_reproducible_and_prefix_routing_raises_hit_rate() -> None:
    # 12 groups x 512-token prefixes = 6144 tokens = 1.5x one replica's KV (256 blocks x 16): with
    # round-robin each replica sees every group and evicts; with affinity each holds about 3.
    items = shared_prefix(seed=5, groups=12, prompts_per_group=8, prefix_tokens=512, question_tokens=32,
                          max_tokens=8, rate_rps=4)
    runs = []
    for _ in range(2):
        clock = VirtualClock()
        runs.append(await _run(build_scheduler(scrape=False, seed=7, clock=clock), items, clock))
    assert runs[0].ttft_s == runs[1].ttft_s and runs[0].per_endpoint == runs[1].per_endpoint
    rr = await _run(RoundRobinScheduler(), items)
    assert len(rr.ttft_s) == len(items) == len(runs[0].ttft_s)
    assert runs[0].hit_rate > 2 * rr.hit_rate
    assert sorted(runs[0].ttft_s)[len(items) // 2] < sorted(rr.ttft_s)[len(items) // 2]
