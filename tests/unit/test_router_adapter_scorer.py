"""The adapter-affinity scorer's formula, FleetState's adapter state, and the scheduler built with it."""

from __future__ import annotations

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.core.types import Endpoint
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig, preset
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.plugins.adapter_scorer import AdapterAffinityScorer
from fleetgate.router.types import RoutingRequest

EPS = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="base") for i in range(3)]
LEGAL = RoutingRequest(request_id="r", model="legal", prompt_text="hi", adapter="legal")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _load(state: FleetState, endpoint_id: str, n: int) -> None:
    for _ in range(n):
        state.started(endpoint_id)


def test_prefers_endpoints_with_the_adapter_loaded() -> None:
    state = FleetState()
    s = AdapterAffinityScorer(name="adapter", state=state)
    assert s.score(LEGAL, {}, EPS) == [0.0, 0.0, 0.0]  # nobody has it: no preference, load decides
    state.set_adapters("e1", {"legal", "other"})
    state.set_adapters("e2", {"other"})
    assert s.score(LEGAL, {}, EPS) == [0.0, 1.0, 0.0]
    base = RoutingRequest(request_id="b", model="base", prompt_text="hi")
    assert s.score(base, {}, EPS) == [0.0, 0.0, 0.0]  # a base-model request: neutral


def test_a_hot_adapter_fades_out_with_excess_load() -> None:
    state = FleetState()
    s = AdapterAffinityScorer(name="adapter", state=state, hotspot_margin=2.0)
    state.set_adapters("e0", {"legal"})
    _load(state, "e0", 2)
    assert s.score(LEGAL, {}, EPS) == [1.0, 0.0, 0.0]  # excess 2 <= margin: full preference
    _load(state, "e0", 1)
    assert s.score(LEGAL, {}, EPS) == [0.5, 0.0, 0.0]  # excess 3: halfway between margin and 2 x margin
    _load(state, "e0", 2)
    assert s.score(LEGAL, {}, EPS) == [0.0, 0.0, 0.0]  # excess 5 >= 2 x margin: only load counts
    unguarded = AdapterAffinityScorer(name="a", state=state, hotspot_margin=None)
    assert unguarded.score(LEGAL, {}, EPS) == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="hotspotMargin"):
        AdapterAffinityScorer(name="a", state=state, hotspot_margin=0)


def test_fleet_state_adapter_bookkeeping() -> None:
    clock = Clock()
    state = FleetState(clock=clock)
    assert not state.has_adapter("e0", "legal")
    state.set_adapters("e0", ["legal"])
    assert state.has_adapter("e0", "legal") and state.adapters == {"e0": frozenset({"legal"})}
    asked = clock()  # a scrape asks /v1/models, then the gateway's own load lands before the answer
    clock.t += 1
    state.add_adapter("e0", "pirate")
    state.set_adapters("e0", {"legal"}, as_of=asked)  # a stale answer cannot undo the load
    assert state.has_adapter("e0", "pirate")
    clock.t += 1
    state.set_adapters("e0", {"legal"}, as_of=clock())  # a fresh answer is the truth (unloaded since)
    assert not state.has_adapter("e0", "pirate")
    state.set_adapters("e1", {"x"})
    state.forget_adapters({"e1"})
    assert state.adapters == {"e1": frozenset({"x"})}


async def test_default_profile_routes_to_the_loaded_endpoint_until_it_is_hot() -> None:
    sched = build_scheduler(scrape=False, seed=1)
    names = {s.name: w for s, w in sched.profile.scorers}
    assert names["adapter"] == 2.0
    state = sched.state
    state.set_adapters("e2", {"legal"})
    for i in range(4):  # held in flight: e2 fills up while it has the adapter
        d = await sched.pick(
            RoutingRequest(request_id=str(i), model="legal", prompt_text=f"q{i}", adapter="legal"), EPS
        )
        assert d.endpoint.id == "e2"
        sched.on_start(RoutingRequest(request_id=str(i), model="legal", prompt_text="", adapter="legal"), d.endpoint)
    _load(state, "e2", 6)  # far past the hotspot guard: the burst spills to the least loaded pods
    d = await sched.pick(RoutingRequest(request_id="x", model="legal", prompt_text="q", adapter="legal"), EPS)
    assert d.endpoint.id in ("e0", "e1")


def test_presets_and_parameter_errors() -> None:
    sched = build_scheduler(preset("adapter-affinity"), scrape=False)
    assert {s.name for s, _ in sched.profile.scorers} == {"inflight", "adapter"}
    assert "adapter" not in {s.name for s, _ in build_scheduler(preset("least-loaded"), scrape=False).profile.scorers}
    data = RoutingConfig().model_dump(by_alias=True)
    for p in data["plugins"]:
        if p["type"] == "adapter-affinity-scorer":
            p["parameters"] = {"hotspotMargin": -1}
    with pytest.raises(ConfigError, match="hotspotMargin"):
        build_scheduler(RoutingConfig.model_validate(data), scrape=False)


def test_serves_model_filter_keeps_the_base_endpoints_of_an_adapter_request() -> None:
    from fleetgate.router.plugins.model_filter import ServesModelFilter

    other = Endpoint(id="x", url="http://x", model="other")
    f = ServesModelFilter(name="f")
    assert f.filter(LEGAL, {}, [*EPS, other]) == [*EPS, other]
    assert f.filter(RoutingRequest(request_id="r", model="base", prompt_text=""), {}, [*EPS, other]) == EPS
