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
    assert names["adapter"] == 3.0
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


def _scraped(state: FleetState, endpoint_id: str, *, active: set[str], max_loras: int | None) -> None:
    state.update(endpoint_id, waiting=0, running=0, kv_usage=0, active_adapters=frozenset(active), max_loras=max_loras)


def test_gpu_slots_from_lora_requests_info_rank_the_endpoints() -> None:
    state = FleetState()
    s = AdapterAffinityScorer(name="adapter", state=state, hotspot_margin=None)
    eps = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="base") for i in range(6)]
    _scraped(state, "e0", active={"legal", "x"}, max_loras=2)  # active here: its requests batch with ours
    state.set_adapters("e0", {"legal", "x"})
    _scraped(state, "e1", active={"x"}, max_loras=2)  # registered, a slot free: swap in, no eviction
    state.set_adapters("e1", {"legal", "x"})
    _scraped(state, "e2", active={"x"}, max_loras=2)  # not registered, a slot free: load from disk
    _scraped(state, "e3", active={"x", "y"}, max_loras=2)  # registered but every slot busy: waits for one
    state.set_adapters("e3", {"legal"})
    _scraped(state, "e4", active={"x", "y"}, max_loras=2)  # neither
    state.set_adapters("e5", {"legal"})  # no lora_requests_info scraped: registered is all it knows
    assert s.score(LEGAL, {}, eps) == [1.0, 0.5, 0.3, 0.15, 0.0, 1.0]


def test_the_hotspot_guard_scales_the_affinity_tier_and_never_raises_it() -> None:
    # score_e = a_e * g_e: a hot pod with a low tier keeps at most that tier (it once became g_e itself,
    # so a busy pod's 0.15 could rise to 0.5 and outrank a cool pod's 0.3).
    state = FleetState()
    s = AdapterAffinityScorer(name="adapter", state=state, hotspot_margin=2.0)
    for e in EPS:
        _scraped(state, e.id, active={"x", "y"}, max_loras=2)
    state.set_adapters("e0", {"legal"})  # registered, slots busy: 0.15
    _scraped(state, "e2", active=set(), max_loras=2)  # not registered, slots free: 0.3
    _load(state, "e0", 3)  # excess 3: g = 0.5
    assert s.score(LEGAL, {}, EPS) == pytest.approx([0.075, 0.0, 0.3])


def test_the_gateways_own_in_flight_adapters_count_before_the_next_scrape() -> None:
    state = FleetState()
    s = AdapterAffinityScorer(name="adapter", state=state, hotspot_margin=None)
    for e in EPS:
        _scraped(state, e.id, active=set(), max_loras=1)
    assert s.score(LEGAL, {}, EPS) == [0.3, 0.3, 0.3]
    s.on_start(LEGAL, {}, EPS[1])  # the first of a burst went to e1: the rest follow it there
    chef = RoutingRequest(request_id="c", model="chef", prompt_text="", adapter="chef")
    assert s.score(LEGAL, {}, EPS) == [0.3, 1.0, 0.3]
    assert s.score(chef, {}, EPS) == [0.3, 0.0, 0.3]  # e1's only slot is taken by legal
    s.on_start(LEGAL, {}, EPS[1])
    s.on_complete(LEGAL, {}, EPS[1], ok=True, usage=None)
    assert s.score(LEGAL, {}, EPS)[1] == 1.0
    s.on_complete(LEGAL, {}, EPS[1], ok=False, usage=None)
    s.on_complete(LEGAL, {}, EPS[1], ok=False, usage=None)  # unbalanced extra: ignored, never negative
    s.on_complete(REQ_BASE, {}, EPS[1], ok=True, usage=None)
    assert s.inflight_adapters("e1") == frozenset()
    # done there, but e1 served legal last: likely still in its GPU slot
    assert s.score(LEGAL, {}, EPS) == [0.3, 0.9, 0.3] and s.score(chef, {}, EPS) == [0.3, 0.3, 0.3]


REQ_BASE = RoutingRequest(request_id="b", model="base", prompt_text="hi")


def test_lora_requests_info_is_parsed_from_the_newest_sample() -> None:
    from fleetgate.router.vllm_metrics import parse_vllm_metrics

    text = "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{model_name="m"} 2.0',
            "# TYPE vllm:lora_requests_info gauge",
            'vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters=""} 1.7e9',
            'vllm:lora_requests_info{max_lora="4",running_lora_adapters="legal,chef",waiting_lora_adapters="x"} 1.8e9',
            'vllm:lora_requests_info{max_lora="4",running_lora_adapters="older",waiting_lora_adapters=""} 1.6e9',
        ]
    )
    parsed = parse_vllm_metrics(text)
    assert parsed.active_adapters == {"legal", "chef", "x"} and parsed.max_loras == 4 and parsed.running == 2
    idle = parse_vllm_metrics(
        "# TYPE vllm:lora_requests_info gauge\n"
        'vllm:lora_requests_info{max_lora="bad",running_lora_adapters="",waiting_lora_adapters=""} 1.0\n'
    )
    assert idle.active_adapters == frozenset() and idle.max_loras is None
    assert parse_vllm_metrics("").active_adapters is None  # no LoRA info: unknown, not "none active"
