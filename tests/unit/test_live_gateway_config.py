"""The live benchmark's gateways: a profile's routing, the tenants' keys, the engines' KV-event routes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgate.bench.live_gateway import Keys, gateway_settings, kv_event_routes, resolve_profile, template_vars
from fleetgate.core.errors import ConfigError
from fleetgate.gateway.settings import GatewaySettings, ModelRoute
from fleetgate.router.config import RoutingConfig

URLS = ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]
VARS = template_vars(urls=URLS, kv_events=["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"], model_dir="/m",
                     block_size=16)


def test_round_robin_has_no_routing_config_presets_do() -> None:
    assert resolve_profile("round-robin", configs={}, variables=VARS).routing is None
    least = resolve_profile("least-loaded", configs={}, variables=VARS)
    assert RoutingConfig.model_validate(least.routing).profile().name == "least-loaded"


def test_an_unknown_profile_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown routing preset 'no-such'"):
        resolve_profile("no-such", configs={}, variables=VARS)


def test_a_routing_file_gets_the_runs_placeholders(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("plugins:\n"
                    "  - {type: prefix-affinity-scorer, name: prefix, parameters: {blockChars: ${BLOCK_SIZE}}}\n"
                    "  - {type: max-score-picker, name: pick}\n"
                    "schedulingProfiles:\n  - {name: mine, plugins: [{pluginRef: prefix}, {pluginRef: pick}]}\n")
    profile = resolve_profile("mine", configs={"mine": path}, variables=VARS)
    assert profile.routing is not None and profile.routing["plugins"][0]["parameters"]["blockChars"] == 16
    path.write_text("plugins: ${NOT_A_VARIABLE}\n")
    with pytest.raises(ConfigError, match="unknown placeholder"):
        resolve_profile("mine", configs={"mine": path}, variables=VARS)


def test_settings_hold_hashes_only_probe_routes_and_kv_events_where_supported() -> None:
    keys = Keys.make(3)
    routes = kv_event_routes(urls=URLS, publishers=["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"],
                             replays=["tcp://127.0.0.1:5567"], topic="kv-events")
    assert routes[0] == {"endpoint": URLS[0], "publisher": "tcp://127.0.0.1:5557", "topic": "kv-events",
                         "replay": "tcp://127.0.0.1:5567"}
    assert "replay" not in routes[1]
    data = gateway_settings(port=9000, metrics_port=9001, model="llama", urls=URLS, keys=keys, routing=None,
                            kv_events=routes)
    settings = GatewaySettings.model_validate(data)
    assert [m.name for m in settings.models] == ["llama", "probe-0", "probe-1"]
    assert settings.models[1].endpoints == [URLS[0]] and settings.models[1].served_name == "llama"
    assert settings.server.auth == "api_key" and len(settings.tenancy.tenants) == 3
    text = str(data)
    assert all(key not in text for key in [*keys.tenants.values(), keys.admin])  # only hashes
    assert ("kv_events" in data["models"][0]) == ("kv_events" in ModelRoute.model_fields)
