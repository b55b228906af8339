"""The discrete-event fleet with LoRA adapters: on-demand loads as the gateway makes them, and what
adapter-affinity routing changes against adapter-blind least-loaded routing."""

from __future__ import annotations

from fleetgate.router.build import build_scheduler
from fleetgate.router.config import preset
from fleetgate.sim.profile import get_profile
from fleetgate.sim.virtual_fleet import VirtualClock, run_virtual_fleet
from fleetgate.sim.workloads import WorkItem, adapter_mix, zipf_weights

PROFILE = get_profile("gpu-8b").with_(enable_lora=True, max_loras=4, max_cpu_loras=8)


async def _run(policy: str, items: list[WorkItem], replicas: int):  # type: ignore[no-untyped-def]
    clock = VirtualClock()
    sched = build_scheduler(preset(policy), scrape=False, seed=1, clock=clock)
    return await run_virtual_fleet(scheduler=sched, items=items, replicas=replicas, profile=PROFILE, clock=clock)


async def test_a_request_for_an_adapter_no_engine_has_waits_for_its_load() -> None:
    items = [
        WorkItem(id="a", prompt="hello " * 40, max_tokens=4, arrival_s=0.0, adapter="ft-0"),
        WorkItem(id="b", prompt="other " * 40, max_tokens=4, arrival_s=5.0, adapter="ft-0"),
    ]
    result = await _run("adapter-affinity", items, replicas=1)
    assert len(result.ttft_s) == 2 and result.adapter_loads == 1 and result.disk_loads == 1
    assert result.ttft_s[0] >= PROFILE.lora_load_s  # the first waited for the load
    assert result.ttft_s[1] < PROFILE.lora_load_s / 3  # the second found it loaded


async def test_adapter_affinity_loads_fewer_adapters_and_cuts_the_tail_against_blind_least_loaded() -> None:
    items = adapter_mix(seed=3, n=300, adapters=8, rate_rps=20.0)
    blind = await _run("least-loaded", items, replicas=3)
    affinity = await _run("adapter-affinity", items, replicas=3)
    assert len(blind.ttft_s) == len(affinity.ttft_s) == 300
    assert affinity.adapter_loads < blind.adapter_loads
    assert affinity.slot_swaps < blind.slot_swaps
    p90 = sorted(affinity.ttft_s)[270], sorted(blind.ttft_s)[270]
    assert p90[0] < p90[1]


def test_zipf_mix_is_skewed_towards_the_first_adapters() -> None:
    weights = zipf_weights(8, 1.1)
    assert abs(sum(weights) - 1) < 1e-9 and weights == sorted(weights, reverse=True)
    items = adapter_mix(seed=1, n=2000, adapters=8)
    counts = [sum(1 for it in items if it.adapter == f"ft-{k}") for k in range(8)]
    assert counts[0] > 3 * counts[7] and sum(counts) == 2000
