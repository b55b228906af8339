"""Load signals relative to the load itself (issue 24, past saturation): the load scorers' `relativeSpan`, the
hotspot guard's `hotspotRelativeMargin`, and the opt-in profile that sets them
(`scripts/gpu/profiles/default-sticky.yaml`; docs/reports/routing-saturation.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetgate.core.errors import ConfigError
from fleetgate.core.types import Endpoint
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import STICKY_PARAMETERS, RoutingConfig, preset
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.plugins.base import CACHED_SHARE, PluginContext, hotspot_guard
from fleetgate.router.plugins.inflight_scorer import build as build_inflight
from fleetgate.router.plugins.load_score import inverse_minmax
from fleetgate.router.plugins.precise_prefix_scorer import build as build_precise
from fleetgate.router.plugins.prefill_queue_scorer import build as build_prefill
from fleetgate.router.plugins.prefix_scorer import build as build_prefix
from fleetgate.router.plugins.queue_scorer import build as build_queue
from fleetgate.router.types import RoutingRequest

EPS = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="m") for i in range(2)]
REQ = RoutingRequest(request_id="r", model="m", prompt_text="hi")
STICKY = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "profiles" / "default-sticky.yaml"


def _load(state: FleetState, endpoint_id: str, n: int) -> None:
    for _ in range(n):
        state.started(endpoint_id)


def test_a_relative_span_makes_a_small_difference_a_small_vote_and_leaves_a_large_one_whole() -> None:
    assert inverse_minmax([61, 60]) == [0.0, 1.0]  # the default: one request is a whole vote
    assert inverse_minmax([61, 60], 0.5) == pytest.approx([1 - 1 / 30.5, 1.0])
    assert inverse_minmax([1, 0], 0.5) == [0.0, 1.0]  # idle engines: unchanged
    assert inverse_minmax([20, 10], 0.5) == [0.0, 1.0]  # twice the load: still a whole vote
    assert inverse_minmax([30, 20], 0.5) == pytest.approx([1 - 10 / 15, 1.0])
    assert inverse_minmax([5, 5], 0.5) == [1.0, 1.0]


def test_the_inflight_and_queue_scorers_read_relative_span() -> None:
    state = FleetState()
    ctx = PluginContext(state=state)
    _load(state, "e0", 61)
    _load(state, "e1", 60)
    assert build_inflight(name="i", parameters={}, ctx=ctx).score(REQ, {}, EPS) == [0.0, 1.0]
    assert build_inflight(name="i", parameters={"relativeSpan": 0.5}, ctx=ctx).score(REQ, {}, EPS) == pytest.approx(
        [1 - 1 / 30.5, 1.0])
    state.stats_of("e0").waiting = 22
    state.stats_of("e1").waiting = 20
    assert build_queue(name="q", parameters={}, ctx=ctx).score(REQ, {}, EPS) == [0.0, 1.0]
    assert build_queue(name="q", parameters={"relativeSpan": 0.5}, ctx=ctx).score(REQ, {}, EPS) == pytest.approx(
        [1 - 2 / 11, 1.0])


def test_a_relative_hotspot_margin_keeps_affinity_on_a_busy_fleet_and_still_fades_a_hotspot() -> None:
    state = FleetState()
    _load(state, "e0", 64)
    _load(state, "e1", 60)
    fixed = [1.0, 0.0]
    hotspot_guard(fixed, EPS, state, 2.0)
    assert fixed == [0.0, 0.0]  # 4 requests ahead of 60: faded out entirely
    relative = [1.0, 0.0]
    hotspot_guard(relative, EPS, state, 2.0, 0.5)
    assert relative == [1.0, 0.0]  # the margin is 30 here
    _load(state, "e0", 36)  # 100 against 60: excess 40, margin 30 -> 1 - 10/30
    hot = [1.0, 0.0]
    hotspot_guard(hot, EPS, state, 2.0, 0.5)
    assert hot == pytest.approx([2 / 3, 0.0])
    idle = FleetState()
    _load(idle, "e0", 4)  # 4 against 0: the fixed margin still rules an idle fleet
    low = [1.0, 0.0]
    hotspot_guard(low, EPS, idle, 2.0, 0.5)
    assert low == [0.0, 0.0]


def test_the_affinity_scorers_read_hotspot_relative_margin() -> None:
    state = FleetState()
    ctx = PluginContext(state=state)
    text = "P" * 2_048
    prompt = RoutingRequest(request_id="a", model="m", prompt_text=text)
    _load(state, "e0", 64)
    _load(state, "e1", 60)
    for params, kept in (({}, 0.0), ({"hotspotRelativeMargin": 0.5}, 1.0)):
        prefix = build_prefix(name="p", parameters=params, ctx=ctx)
        prefix.index.record("e0", prefix.hashes(prompt, {}))
        assert prefix.score(prompt, {}, EPS) == [kept, 0.0]
        prefill = build_prefill(name="q", parameters=params, ctx=ctx)
        cycle = {CACHED_SHARE: {"e0": 1.0, "e1": 0.0}}
        # kept: e0 would compute nothing, e1 the whole prompt (512 tokens of 2,048's scale)
        assert prefill.score(prompt, cycle, EPS) == pytest.approx([1.0, 1.0 - 512 / 2_048 * kept])
    precise = build_precise(name="pp", parameters={"hotspotRelativeMargin": 0.5}, ctx=ctx)
    assert precise.hotspot_relative_margin == 0.5
    assert precise.approx.hotspot_relative_margin == 0.5  # its fallback index guards alike


@pytest.mark.parametrize(("plugin", "parameters", "named"), [
    ("inflight-scorer", {"relativeSpan": -1}, "relativeSpan"),
    ("queue-depth-scorer", {"relativeSpan": -0.5}, "relativeSpan"),
    ("prefix-affinity-scorer", {"hotspotRelativeMargin": -1}, "hotspotRelativeMargin"),
    ("prefill-queue-scorer", {"hotspotRelativeMargin": -1}, "hotspotRelativeMargin"),
])
def test_negative_relative_parameters_are_config_errors(plugin: str, parameters: dict[str, object],
                                                         named: str) -> None:
    cfg = RoutingConfig.model_validate({
        "plugins": [{"type": plugin, "name": "s", "parameters": parameters},
                    {"type": "max-score-picker", "name": "pick"}],
        "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "s"}, {"pluginRef": "pick"}]}]})
    with pytest.raises(ConfigError, match=named):
        build_scheduler(cfg, scrape=False)


def _sticky() -> RoutingConfig:
    return RoutingConfig.model_validate(yaml.safe_load(STICKY.read_text()))


@pytest.mark.parametrize(("config", "busy", "other", "expected"), [
    # the shipped default moves a warm prompt group off an engine 4 requests ahead of 60
    ("default", 64, 60, "e1"),
    ("sticky", 64, 60, "e0"),
    # ... and so does the opt-in profile once the lead is a hotspot (100 against 40)
    ("sticky", 100, 40, "e1"),
    # on an idle fleet both spread: 4 against 0 is a hotspot
    ("default", 4, 0, "e1"),
    ("sticky", 4, 0, "e1"),
])
async def test_a_warm_prompt_group_stays_on_its_busy_engine_until_the_lead_is_a_hotspot(
        config: str, busy: int, other: int, expected: str) -> None:
    sched = build_scheduler(RoutingConfig() if config == "default" else _sticky(), scrape=False, seed=1)
    system = "group 7 system prompt. " * 200
    first = RoutingRequest(request_id="a", model="m", prompt_text=system + "first question")
    sched.on_start(first, EPS[0])  # the group's prefix went to e0
    sched.on_complete(first, EPS[0], ok=True, usage=None)
    _load(sched.state, "e0", busy)
    _load(sched.state, "e1", other)
    second = RoutingRequest(request_id="b", model="m", prompt_text=system + "second question")
    assert (await sched.pick(second, EPS)).endpoint.id == expected


def test_the_preset_is_the_profile_file() -> None:
    """`--profiles default-sticky` (a build with the preset) and `--profile-config default-sticky=...yaml` (any
    build with the parameters) run the same profile, and it is the shipped default but for the four parameters."""
    preset_cfg, file_cfg, default = preset("default-sticky"), _sticky(), RoutingConfig()
    assert preset_cfg == file_cfg
    assert preset_cfg.scheduling_profiles[0].plugins == default.scheduling_profiles[0].plugins
    changed = {p.ref: {k: v for k, v in p.parameters.items() if k not in d.parameters}
               for p, d in zip(preset_cfg.plugins, default.plugins, strict=True)}
    assert {k: v for k, v in changed.items() if v} == STICKY_PARAMETERS
