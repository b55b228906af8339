"""YAML composition of the scheduler, presets and configuration errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetgate.core.config import load_model
from fleetgate.core.errors import ConfigError
from fleetgate.core.types import Endpoint
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig, preset
from fleetgate.router.types import RoutingRequest

EPS = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="m") for i in range(3)]

YAML = """
apiVersion: fleetgate.io/v1alpha1
kind: RoutingConfig
plugins:
  - {type: serves-model-filter}
  - {type: queue-depth-scorer, name: queue}
  - {type: session-affinity-scorer, name: session, parameters: {maxSessions: 10}}
  - {type: max-score-picker, parameters: {seed: 1}}
schedulingProfiles:
  - name: default
    plugins:
      - {pluginRef: serves-model-filter}
      - {pluginRef: queue, weight: 2}
      - {pluginRef: session, weight: 5}
      - {pluginRef: max-score-picker}
ejection: {baseS: 0.5, maxS: 4}
"""


async def test_yaml_composes_filters_weighted_scorers_and_picker(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(YAML)
    cfg = load_model(RoutingConfig, path)
    sched = build_scheduler(cfg, scrape=False)
    assert [f.name for f in sched.profile.filters] == ["serves-model-filter"]
    assert [(s.name, w) for s, w in sched.profile.scorers] == [("queue", 2.0), ("session", 5.0)]
    assert sched.state.health.base_s == 0.5
    sched.state.stats_of("e0").waiting = 4
    sched.state.stats_of("e1").waiting = 2
    req = RoutingRequest(request_id="1", model="m", prompt_text="x", session_key="s")
    d = await sched.pick(req, EPS)
    assert d.endpoint.id == "e2" and d.fallbacks == [EPS[1]]
    assert d.reasons == {"queue": 2.0, "session": 0.0, "total": 2.0}
    sched.on_start(req, EPS[0])  # the gateway sent it elsewhere: session now points to e0
    d2 = await sched.pick(RoutingRequest(request_id="2", model="m", prompt_text="x", session_key="s"), EPS)
    assert d2.endpoint.id == "e0" and d2.reasons["session"] == 5.0


def test_unknown_plugin_type_is_a_clear_error() -> None:
    data = yaml.safe_load(YAML)
    data["plugins"][1]["type"] = "no-such-scorer"
    with pytest.raises(ConfigError, match="unknown routing plugin type 'no-such-scorer'"):
        build_scheduler(RoutingConfig.model_validate(data), scrape=False)


def test_config_validation_errors() -> None:
    data = yaml.safe_load(YAML)
    data["schedulingProfiles"][0]["plugins"].append({"pluginRef": "ghost"})
    with pytest.raises(ValueError, match="not declared"):
        RoutingConfig.model_validate(data)
    data = yaml.safe_load(YAML)
    data["apiVersion"] = "fleetgate.io/v9"
    with pytest.raises(ValueError):
        RoutingConfig.model_validate(data)
    data = yaml.safe_load(YAML)
    data["plugins"][1]["parameters"] = {"x": 1}
    data["plugins"][2]["parameters"] = {"maxSessions": "many"}
    with pytest.raises(ConfigError, match="maxSessions"):
        build_scheduler(RoutingConfig.model_validate(data), scrape=False)
    data = yaml.safe_load(YAML)
    data["schedulingProfiles"][0]["plugins"].pop()
    with pytest.raises(ConfigError, match="exactly one picker"):
        build_scheduler(RoutingConfig.model_validate(data), scrape=False)


def test_default_and_presets_build() -> None:
    default = build_scheduler(scrape=False)
    names = {s.name for s, _ in default.profile.scorers}
    assert {"prefix", "inflight", "queue", "kv-usage", "session"} <= names
    assert RoutingConfig().model_dump(by_alias=True)["apiVersion"] == "fleetgate.io/v1alpha1"
    for name in ("least-loaded", "prefix-only", "random"):
        assert build_scheduler(preset(name), scrape=False).profile.name == name
    with pytest.raises(ValueError, match="unknown routing preset"):
        preset("nope")


def test_shipped_example_is_the_default_profile() -> None:
    example = load_model(RoutingConfig, Path(__file__).resolve().parents[2] / "router" / "examples" / "routing.yaml")
    default = RoutingConfig()
    assert example.profile() == default.profile()
    assert [(p.type, p.ref) for p in example.plugins] == [(p.type, p.ref) for p in default.plugins]
    assert example.scrape == default.scrape and example.ejection == default.ejection


def test_shipped_precise_example_is_the_precise_preset() -> None:
    path = Path(__file__).resolve().parents[2] / "router" / "examples" / "precise-prefix.yaml"
    example = load_model(RoutingConfig, path)
    preset_config = preset("precise-prefix")
    assert example.profile() == preset_config.profile()
    assert [(p.type, p.ref) for p in example.plugins] == [(p.type, p.ref) for p in preset_config.plugins]
    prefix = next(p for p in example.plugins if p.ref == "prefix")
    assert prefix.type == "precise-prefix-scorer" and prefix.parameters["tokenizer"] == "engine"
    assert build_scheduler(example, scrape=False).profile.name == "precise-prefix"


def test_the_gpu_benchmarks_precise_profile_is_the_preset_with_a_local_tokenizer() -> None:
    from fleetgate.bench.live_gateway import resolve_profile

    path = Path(__file__).resolve().parents[2] / "router" / "examples" / "precise-prefix-gpu.yaml"
    variables = {"ENGINE_URLS": "[]", "KV_EVENTS_ENDPOINTS": "[]", "MODEL_DIR": "/work/models/llama",
                 "BLOCK_SIZE": "16"}
    profile = resolve_profile("precise-prefix", configs={"precise-prefix": path}, variables=variables)
    assert profile.routing is not None
    config = RoutingConfig.model_validate(profile.routing)
    preset_config = preset("precise-prefix")
    assert config.profile() == preset_config.profile()
    assert [(p.type, p.ref) for p in config.plugins] == [(p.type, p.ref) for p in preset_config.plugins]
    prefix = next(p for p in config.plugins if p.ref == "prefix")
    assert prefix.parameters == {"tokenizer": "local", "tokenizerPaths": {"*": "/work/models/llama"}}
    assert build_scheduler(config, scrape=False).profile.name == "precise-prefix"
