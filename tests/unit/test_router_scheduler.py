"""The plugin scheduler end to end in-process: decisions, fallbacks, health, failing producers."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from fleetgate.core.errors import UpstreamUnavailableError
from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import PluginRef, PluginSpec, RoutingConfig, SchedulingProfile
from fleetgate.router.plugins.base import CycleState, PluginContext
from fleetgate.router.types import RoutingRequest

EPS = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="m") for i in range(4)]
SYSTEM = "You are a helpful assistant. " * 100


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def req(i: int, text: str, session: str | None = None) -> RoutingRequest:
    return RoutingRequest(request_id=f"r{i}", model="m", prompt_text=text, session_key=session)


async def test_default_routes_a_shared_prefix_back_to_the_same_endpoint_and_times_plugins() -> None:
    registry = CollectorRegistry()
    sched = build_scheduler(registry=registry, scrape=False, seed=0)
    first = await sched.pick(req(0, SYSTEM + "question zero"), EPS)
    sched.on_start(req(0, SYSTEM + "question zero"), first.endpoint)
    sched.on_complete(req(0, SYSTEM + "question zero"), first.endpoint, ok=True, usage=Usage(10, 2, 0))
    again = await sched.pick(req(1, SYSTEM + "another question"), EPS)
    assert again.endpoint == first.endpoint
    assert again.reasons["prefix"] > 1.5 and again.fallbacks and again.fallbacks[0] != first.endpoint
    count = registry.get_sample_value("fleetgate_router_plugin_seconds_count", {"plugin": "prefix", "stage": "score"})
    assert count == 2
    assert registry.get_sample_value("fleetgate_router_decision_seconds_count", {"profile": "default"}) == 2


async def test_load_breaks_a_hot_prefix() -> None:
    sched = build_scheduler(scrape=False, seed=0)
    sent: dict[str, int] = {}
    for i in range(40):  # 40 concurrent requests sharing one long system prompt, none completes
        r = req(i, SYSTEM + f"user question {i}")
        d = await sched.pick(r, EPS)
        sched.on_start(r, d.endpoint)
        sent[d.endpoint.id] = sent.get(d.endpoint.id, 0) + 1
    assert len(sent) == 4  # the guard spread the hot prefix over every endpoint
    assert max(sent.values()) - min(sent.values()) <= 4  # excess load never passes 2 x hotspotMargin


async def test_connect_error_ejects_with_backoff_and_success_restores() -> None:
    clock = Clock()
    cfg = RoutingConfig.model_validate({"ejection": {"baseS": 1, "maxS": 4}})
    sched = build_scheduler(cfg, scrape=False, clock=clock, seed=0)
    sched.on_connect_error(EPS[0])
    for i in range(20):
        d = await sched.pick(req(i, f"q{i}"), EPS)
        assert d.endpoint != EPS[0] and EPS[0] not in d.fallbacks
    clock.t = 1.01
    assert EPS[0] in {(await sched.pick(req(100 + i, f"x{i}"), EPS)).endpoint for i in range(40)}
    sched.on_connect_error(EPS[0])
    sched.on_connect_error(EPS[0])  # third failure in a row: 4 s (capped)
    assert sched.state.health.ejected_until("e0") == pytest.approx(1.01 + 4)
    sched.on_complete(req(1, "q"), EPS[0], ok=True, usage=None)
    assert not sched.state.health.is_ejected("e0")


async def test_no_candidate_is_a_503_and_a_failing_producer_fails_open() -> None:
    class Broken:
        name = "broken"

        async def produce(self, r: RoutingRequest, cycle: CycleState, endpoints: object) -> None:
            raise RuntimeError("redis down")

    def build_broken(*, name: str, parameters: dict, ctx: PluginContext) -> Broken:
        return Broken()

    registry = CollectorRegistry()
    cfg = RoutingConfig(
        plugins=[PluginSpec(type="broken", name="broken"), PluginSpec(type="max-score-picker", name="pick")],
        scheduling_profiles=[
            SchedulingProfile(name="p", plugins=[PluginRef(plugin_ref="broken"), PluginRef(plugin_ref="pick")])
        ],
    )
    sched = build_scheduler(cfg, scrape=False, registry=registry, extra_plugins={"broken": build_broken})
    d = await sched.pick(req(0, "x"), EPS[:1])
    assert d.endpoint == EPS[0] and d.fallbacks == []
    assert registry.get_sample_value("fleetgate_router_plugin_errors_total", {"plugin": "broken"}) == 1
    with pytest.raises(UpstreamUnavailableError):
        await sched.pick(req(1, "x"), [])
