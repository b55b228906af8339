"""The scheduler scrapes real /metrics (simulated engines) and ejects an engine that goes away."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from fleetgate.core.types import Endpoint
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig
from fleetgate.router.types import RoutingRequest
from fleetgate.router.vllm_metrics import parse_vllm_metrics
from fleetgate.sim.fleet import start_sim_fleet
from fleetgate.sim.profile import SimProfile

PROFILE = SimProfile(model="sim-model", num_blocks=512, time_scale=0.1)


class Source:
    def __init__(self, endpoints: list[Endpoint]) -> None:
        self._eps = endpoints

    def models(self) -> list[str]:
        return ["sim-model"]

    async def endpoints(self, model: str) -> list[Endpoint]:  # async is accepted too
        return list(self._eps)


async def _until(cond, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_scrape_fills_stats_and_a_dead_engine_is_ejected() -> None:
    live = await start_sim_fleet(replicas=1, profile=PROFILE)
    dying = await start_sim_fleet(replicas=1, profile=PROFILE)
    eps = [Endpoint(id=f"ep{i}", url=url, model="sim-model") for i, url in enumerate([*live.urls, *dying.urls])]
    cfg = RoutingConfig.model_validate({"scrape": {"intervalS": 0.05, "timeoutS": 0.5, "healthIntervalS": 0.05}})
    registry = CollectorRegistry()
    sched = build_scheduler(cfg, registry=registry, source=Source(eps), seed=0)
    try:
        await sched.start()
        await _until(lambda: all(sched.state.stats.get(e.id) and sched.state.stats[e.id].scraped_at for e in eps))
        assert sched.state.stats["ep0"].kv_capacity_tokens == 512 * 16
        age = registry.get_sample_value("fleetgate_router_endpoint_metrics_age_seconds", {"endpoint": "ep0"})
        assert age is not None and 0 <= age < 1
        await dying.aclose()
        await _until(lambda: sched.state.health.is_ejected("ep1"))
        assert registry.get_sample_value("fleetgate_router_endpoint_ejected", {"endpoint": "ep1"}) == 1
        for i in range(10):
            d = await sched.pick(RoutingRequest(request_id=str(i), model="sim-model", prompt_text=f"q{i}"), eps)
            assert d.endpoint.id == "ep0"
    finally:
        await sched.aclose()
        await live.aclose()


def test_parse_vllm_metrics_sums_engines_and_reads_capacity() -> None:
    text = "\n".join([
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0',
        'vllm:num_requests_waiting{engine="1",model_name="m"} 2.0',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2',
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.4',
        "# TYPE vllm:cache_config_info gauge",
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0',
        "# TYPE vllm:other_metric counter",
        'vllm:other_metric_total{engine="0"} 7.0',
    ])
    parsed = parse_vllm_metrics(text)
    assert parsed.waiting == 5 and parsed.running == 0
    assert abs(parsed.kv_usage - 0.3) < 1e-9
    assert parsed.kv_capacity_tokens == 1600
