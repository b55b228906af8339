"""Issue 27 in the live routing benchmark: the door points' plan, the picker's settings, the probes' requests, the
Envoy-alone bootstrap, the added-TTFT figures, and the report's section and targets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetgate.bench import live_epp
from fleetgate.bench.envoy_phase import PIN_HEADER, plain_proxy_config
from fleetgate.bench.live_cli import add_live_arguments, options_from_args
from fleetgate.bench.live_gateway import Keys, Profile, gateway_settings, resolve_profile
from fleetgate.bench.live_points import LiveContext
from fleetgate.bench.live_report import door_gains, door_targets, markdown, points
from fleetgate.bench.live_routing import (
    DOOR_START_S,
    LATENCY_FIXED_S,
    LiveOptions,
    _point_line,
    accounting_summary,
    estimate_s,
    plan,
)
from fleetgate.core.errors import ConfigError
from fleetgate.sim.workloads import Sizes


def options(**kw: Any) -> LiveOptions:
    base: dict[str, Any] = {"profiles": ["round-robin", "default"], "loads": [1.2, 1.0], "unique_loads": [],
                            "chat_loads": [], "short_window_s": 12.0}
    return LiveOptions(**{**base, **kw})


def test_without_epp_loads_the_plan_has_no_door_points() -> None:
    assert not [s for s in plan(options(), 10.0) if s.tag.startswith("door")]


def test_door_points_come_last_with_one_seed_per_load_and_the_doors_alternating() -> None:
    specs = plan(options(epp_loads=[1.0, 0.8], epp_profiles=["least-loaded", "default"]), 10.0)
    first_door = next(i for i, s in enumerate(specs) if s.tag.startswith("door"))
    doors = specs[first_door:]
    assert all(s.tag in ("door", "door-latency") for s in doors)  # nothing else after them
    assert [(s.load, s.profile, s.door, s.tag) for s in doors] == [
        (1.0, "least-loaded", "gateway", "door"), (1.0, "least-loaded", "envoy+epp", "door"),
        (1.0, "default", "envoy+epp", "door"), (1.0, "default", "gateway", "door"),
        (1.0, "default", "envoy+epp", "door-latency"),
        (0.8, "least-loaded", "gateway", "door"), (0.8, "least-loaded", "envoy+epp", "door"),
        (0.8, "default", "envoy+epp", "door"), (0.8, "default", "gateway", "door")]
    gain = [s for s in doors if s.tag == "door"]
    assert len({s.seed for s in gain if s.load == 1.0}) == 1 and len({s.seed for s in gain}) == 2
    assert all(s.window_s == 12.0 and s.rate == 10.0 * s.load for s in gain)  # --short-window by default
    assert "via envoy+epp" in doors[1].name and "via" not in doors[0].name


def test_the_latency_phase_can_be_left_out_and_the_window_set() -> None:
    specs = plan(options(epp_loads=[1.0], epp_latency_window_s=0, epp_window_s=7.0), 10.0)
    doors = [s for s in specs if s.tag.startswith("door")]
    assert len(doors) == 4 and {s.window_s for s in doors} == {7.0}


def test_estimates_count_the_door_start_and_the_latency_phase() -> None:
    specs = [s for s in plan(options(epp_loads=[1.0]), 10.0) if s.tag.startswith("door")]
    gateway, epp = specs[0], specs[1]
    assert estimate_s(epp) == estimate_s(gateway) + DOOR_START_S
    latency = next(s for s in specs if s.tag == "door-latency")
    assert estimate_s(latency) == latency.window_s + LATENCY_FIXED_S


def test_the_command_line_flags_reach_the_options() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix-tokens", type=int, default=None)
    parser.add_argument("--kv-tokens", type=int, default=None)
    add_live_arguments(parser)
    o = options_from_args(parser.parse_args(["--epp-loads", "1.0,0.8", "--epp-profiles", "least-loaded,default",
                                             "--epp-window", "9", "--epp-latency-window", "6", "--epp-idle-rounds",
                                             "8", "--epp-site", "/root/epp/epp-site"]))
    assert (o.epp_loads, o.epp_profiles, o.epp_window_s) == ([1.0, 0.8], ["least-loaded", "default"], 9.0)
    assert (o.epp_latency_window_s, o.epp_idle_rounds, o.epp_site) == (6.0, 8, "/root/epp/epp-site")
    assert o.epp_latency_profile == "default"  # the shipped profile: the last
    assert options_from_args(parser.parse_args([])).epp_loads == []


def spec(tmp_path: Path) -> live_epp.PickerSpec:
    return live_epp.PickerSpec(model="m", urls=["http://127.0.0.1:1", "http://127.0.0.1:2"], keys=Keys.make(2),
                               workdir=tmp_path, kv_events=[], epp_site="/site")


def test_the_picker_runs_the_gateway_settings_of_its_profile(tmp_path: Path) -> None:
    s = spec(tmp_path)
    profile = resolve_profile("least-loaded", configs={}, variables={})
    settings = live_epp.picker_settings(s, profile, grpc_port=9100, metrics_port=9101)
    same = gateway_settings(port=settings["server"]["port"], metrics_port=9101, model="m", urls=s.urls, keys=s.keys,
                            routing=profile.routing)
    # the same settings, but warnings alone in its log, as the benchmark's gateway child (no usage line per request)
    assert settings == {**same, "epp": {"host": "127.0.0.1", "port": 9100},
                        "server": {**same["server"], "log_level": "warning"}}
    from fleetgate.gateway.settings import GatewaySettings

    GatewaySettings.model_validate(settings)  # what `fleetgate epp --config` will load
    with pytest.raises(ConfigError, match="round-robin"):
        live_epp.picker_settings(s, Profile(name="round-robin", routing=None), grpc_port=1, metrics_port=2)


def test_the_picker_gets_its_site_first_on_its_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/tree:/kit")
    assert live_epp.picker_env("/site")["PYTHONPATH"] == "/site:/tree:/kit"
    assert live_epp.picker_env("")["PYTHONPATH"] == "/tree:/kit"
    monkeypatch.delenv("PYTHONPATH")
    assert live_epp.picker_env("/site")["PYTHONPATH"] == "/site"


def context(tmp_path: Path) -> LiveContext:
    return LiveContext(session=None, urls=["http://127.0.0.1:1", "http://127.0.0.1:2"],  # type: ignore[arg-type]
                       model="llama", keys=Keys.make(2), sizes=Sizes(), chars_per_token=4.0, capacity_tokens=1000,
                       workdir=tmp_path, profiles={})


def test_each_probe_goes_to_engine_k_by_its_own_door(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    doors = {live_epp.ALONE: "http://alone", live_epp.EPP: "http://epp", live_epp.GATEWAY: "http://gw"}
    prober = live_epp.DoorProber(ctx, doors)
    direct = prober.door_request(engine=1, door=live_epp.DIRECT)
    alone = prober.door_request(engine=1, door=live_epp.ALONE)
    epp = prober.door_request(engine=1, door=live_epp.EPP)
    gw = prober.door_request(engine=1, door=live_epp.GATEWAY)
    assert (direct.url, alone.url, epp.url, gw.url) == ("http://127.0.0.1:2", "http://alone", "http://epp",
                                                        "http://gw")
    assert [r.path for r in (direct, alone, epp, gw)] == ["direct", "envoy alone", "envoy+epp", "gateway"]
    assert alone.headers[PIN_HEADER] == "1" and orjson.loads(alone.body)["model"] == "llama"
    for r in (epp, gw):  # the picker and the gateway route model probe-1 to engine 1 alone, for the tenant
        assert orjson.loads(r.body)["model"] == "probe-1" and r.headers["Authorization"].startswith("Bearer ")
        assert PIN_HEADER not in r.headers
    # every probe carries the same cached prefix and a suffix of its own
    bodies = [orjson.loads(r.body)["prompt"] for r in (direct, alone, epp, gw)]
    assert len(set(bodies)) == 4 and len({b.split("\n")[0] for b in bodies}) == 1


def test_envoy_alone_pins_an_engine_by_header_and_round_robins_the_rest() -> None:
    config = plain_proxy_config(listen=1, upstream=("127.0.0.1", 10), more=[("127.0.0.1", 11)])
    resources = config["static_resources"]
    hcm = resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert [r["route"]["cluster"] for r in routes] == ["engine-0", "engine-1", "engine"]
    assert routes[1]["match"]["headers"] == [{"name": PIN_HEADER, "string_match": {"exact": "1"}}]
    clusters = {c["name"]: [e["endpoint"]["address"]["socket_address"]["port_value"]
                            for e in c["load_assignment"]["endpoints"][0]["lb_endpoints"]]
                for c in resources["clusters"]}
    assert clusters == {"engine": [10, 11], "engine-0": [10], "engine-1": [11]}
    single = plain_proxy_config(listen=1, upstream=("127.0.0.1", 10))["static_resources"]
    assert [c["name"] for c in single["clusters"]] == ["engine"]  # `fleetgate bench gateway`'s, unchanged


def test_added_ttft_per_round() -> None:
    rounds = [{"direct": 0.010, "envoy alone": 0.011 + i * 1e-4, "envoy+epp": 0.013 + i * 3e-4, "gateway": 0.0115}
              for i in range(11)]
    figs = live_epp.figures(rounds)
    over_alone = figs["envoy+epp - envoy alone"]
    assert over_alone["n"] == 11 and over_alone["p50_ms"] == pytest.approx(3.0, abs=1e-6)  # 2 ms + 5 x 0.2 ms
    assert over_alone["mean_ms"][1] <= over_alone["mean_ms"][0] <= over_alone["mean_ms"][2]
    assert figs["gateway - direct"]["p50_ms"] == pytest.approx(1.5)
    assert live_epp.added([], "envoy+epp", "direct") == {"n": 0, "p50_ms": None, "p90_ms": None, "mean_ms": None}


def door_point(door: str, profile: str, p50: float, hit: float, load: float = 1.0) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": "point", "tag": "door", "door": door, "workload": "shared-prefix",
                           "profile": profile, "load": load, "rate": 50.0, "window_s": 12.0, "requests": 600,
                           "errors": 0, "cancelled": 0, "forced": 0, "ttft_p50_s": p50, "ttft_p90_s": 2 * p50,
                           "ttft_steady_p90_s": 2 * p50, "output_tps": 3000.0, "hit_rate": hit,
                           "gateway_cpu_ms_per_request": 5.0, "spread": {}, "elapsed_s": 20.0,
                           "engine_prompt_tokens": 1000, "engine_generation_tokens": 100}
    if door == "gateway":
        row.update(charged_prompt_tokens=1000, charged_completion_tokens=100, lost_prompt_tokens=0,
                   lost_completion_tokens=0, comparable=True)
    return row


def latency_row(idle_p50: float, loaded_mean: list[float]) -> dict[str, Any]:
    fig = {"n": 40, "p50_ms": idle_p50, "p90_ms": idle_p50 + 1, "mean_ms": [idle_p50, idle_p50 - 0.2, idle_p50 + 0.2]}
    loaded = {"n": 80, "p50_ms": 0.4, "p90_ms": 9.0, "mean_ms": loaded_mean}
    names = [f"{a} - {b}" for a, b in live_epp.COMPARISONS]
    return {"kind": "door-latency", "profile": "default", "load": 1.0, "rate": 50.0, "window_s": 10.0, "seed": 1,
            "idle_rounds": 40, "loaded_rounds": 80, "idle": dict.fromkeys(names, fig),
            "loaded": dict.fromkeys(names, loaded), "background_requests": 500, "background_errors": 0,
            "background_ttft_p50_s": 0.13, "picker_cpu_ms_per_request": 4.0, "epp_envoy_cpu_ms_per_request": 1.0,
            "alone_envoy_cpu_ms_per_request": 0.3, "gateway_cpu_ms_per_request": 2.0, "client_loop_lag_p99_s": 0.002,
            "cpus": 32, "load_average": 0.5}


def rows() -> list[dict[str, Any]]:
    meta = {"kind": "meta", "options": {"epp_profiles": ["least-loaded", "default"]}}
    return [meta, door_point("gateway", "least-loaded", 1.0, 0.30), door_point("envoy+epp", "least-loaded", 1.0, 0.30),
            door_point("envoy+epp", "default", 0.25, 0.57), door_point("gateway", "default", 0.2, 0.60),
            latency_row(1.5, [1.9, 1.5, 2.4])]


def test_the_gain_of_each_door_and_their_ratio() -> None:
    g = door_gains(rows())[1.0]
    assert (g["base"], g["shipped"]) == ("least-loaded", "default")
    assert g["gateway"] == {"ttft": pytest.approx(5.0), "hit": pytest.approx(2.0)}
    assert g["envoy+epp"] == {"ttft": pytest.approx(4.0), "hit": pytest.approx(1.9)}
    assert g["ttft_ratio"] == pytest.approx(0.8) and g["hit_ratio"] == pytest.approx(0.95)
    assert g["door_cost_ms"] == pytest.approx(50.0)
    assert g["shipped_hit_ratio"] == pytest.approx(0.95)  # 57% / 60%


def test_the_targets_of_issue_27() -> None:
    found = {name: (met, figure) for name, met, figure in door_targets(rows())}
    gain = next(v for k, v in found.items() if k.startswith("shared-prefix x1: prefix-routing gain"))
    assert gain[0] is False and "TTFT-gain ratio 0.800" in gain[1] and "door cost +50.0 ms" in gain[1]
    idle = next(v for k, v in found.items() if "(idle" in k)
    assert idle[0] is True and "p50 +1.50 ms" in idle[1]
    loaded = next(v for k, v in found.items() if "under load" in k)
    assert loaded[0] is None and "mean +1.90 ms (+1.50..+2.40)" in loaded[1]  # straddles 2 ms: not settled
    for idle_p50, mean, verdicts in ((2.5, [2.6, 2.1, 3.0], [False, False]), (2.5, [2.1, 1.7, 2.6], [False, False]),
                                     (0.9, [1.2, 0.9, 1.6], [True, True])):
        found_now = door_targets([*rows()[:-1], latency_row(idle_p50, mean)])
        assert [met for name, met, _ in found_now if "Envoy alone" in name] == verdicts
    one_door = [r for r in rows() if r.get("door") != "envoy+epp"]
    assert next(met for name, met, _ in door_targets(one_door) if "gain" in name) is None


def test_the_report_has_an_issue_27_section_and_keeps_door_rows_out_of_the_routing_tables() -> None:
    text = markdown(rows(), info={"engine_desc": "test"})
    assert "## Envoy + EPP against the gateway (issue 27)" in text
    assert "### shared-prefix x1 through both doors" in text and "| envoy+epp | default | 600 |" in text
    assert "Envoy + EPP's gain / the gateway's: TTFT p50 0.800, hit rate 0.950" in text
    assert "default's hit rate through Envoy + EPP / through the gateway 0.950" in text
    assert "| envoy+epp - envoy alone | +1.50 | +2.50 | +1.50 (+1.30..+1.70) | +0.40 | +9.00 |" in text
    assert "MISSED: shared-prefix x1: prefix-routing gain" in text
    assert points(rows()) == {}  # the routing tables and their targets see none of them


def test_the_picker_points_stay_out_of_the_accounting_and_say_so() -> None:
    summary = accounting_summary(rows())
    assert summary["rows"] == 2 and summary["excluded"] == [] and summary["verdict"] == "PASS"
    line = _point_line(rows()[2])
    assert "via envoy+epp" in line and "charges not read" in line
    assert "lost 0/0" in _point_line(rows()[1])
