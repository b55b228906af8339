"""`fleetgate up` configuration: embedded defaults, YAML loading, overrides and clear errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.local.config import EngineConfig, UpConfig, load_up_config
from fleetgate.local.up import add_arguments, apply_overrides, route_models


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_work_without_a_file() -> None:
    config = load_up_config(None)
    assert config.engine.kind == "vllm"
    assert config.engine.replicas == 1
    assert config.engine.model == "gemma-3-270m"
    assert config.engine.host == "127.0.0.1"
    assert config.gateway.server.host == "127.0.0.1"
    assert config.engine.port_of(0) == 8100
    assert config.engine.port_of(2) == 8102


def test_yaml_sets_engine_and_gateway(tmp_path: Path) -> None:
    path = tmp_path / "up.yaml"
    path.write_text(
        "engine:\n  replicas: 2\n  base_port: 9100\n  max_model_len: 1024\n  extra_args: ['--seed', '7']\n"
        "gateway:\n  server:\n    port: 9000\n"
    )
    config = load_up_config(path)
    assert config.engine.replicas == 2
    assert config.engine.port_of(1) == 9101
    assert config.engine.max_model_len == 1024
    assert config.engine.extra_args == ["--seed", "7"]
    assert config.gateway.server.port == 9000


def test_unknown_field_is_named(tmp_path: Path) -> None:
    path = tmp_path / "up.yaml"
    path.write_text("engine:\n  replicaz: 2\n")
    with pytest.raises(ConfigError, match=r"engine\.replicaz"):
        load_up_config(path)


def test_gateway_port_inside_engine_ports_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "up.yaml"
    path.write_text("engine:\n  replicas: 3\n  base_port: 9000\ngateway:\n  server:\n    port: 9002\n")
    with pytest.raises(ConfigError, match="collides"):
        load_up_config(path)


def test_threads_split_the_cpus_between_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert EngineConfig(replicas=1).threads_per_engine() == 7  # one core left to the API server
    assert EngineConfig(replicas=2).threads_per_engine() == 3
    assert EngineConfig(replicas=16).threads_per_engine() == 1
    assert EngineConfig(replicas=2, threads=4).threads_per_engine() == 4
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert EngineConfig(replicas=1).threads_per_engine() == 1


def test_command_line_overrides_the_file() -> None:
    config = apply_overrides(UpConfig(), _args("--replicas", "3", "--engine", "sim", "--port", "0"))
    assert (config.engine.replicas, config.engine.kind, config.gateway.server.port) == (3, "sim", 0)
    with pytest.raises(ConfigError):
        apply_overrides(UpConfig(), _args("--replicas", "0"))


def test_routes_point_at_the_engines() -> None:
    urls = ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]
    settings = route_models(gateway=UpConfig().gateway, model="gemma-3-270m", served_name="gemma-3-270m", urls=urls)
    assert [(r.name, r.endpoints, r.served_name) for r in settings.models] == [("gemma-3-270m", urls, None)]
    renamed = route_models(gateway=UpConfig().gateway, model="small", served_name="gemma-3-270m", urls=urls)
    assert renamed.models[0].served_name == "gemma-3-270m"


def test_routes_to_the_local_engines_carry_their_context_length(tmp_path: Path) -> None:
    urls = ["http://127.0.0.1:8100"]
    made = route_models(gateway=UpConfig().gateway, model="m", served_name="m", urls=urls, max_model_len=4096)
    assert made.models[0].max_model_len == 4096
    path = tmp_path / "up.yaml"
    path.write_text("gateway:\n  models:\n  - name: a\n  - name: b\n    max_model_len: 1024\n")
    filled = route_models(gateway=load_up_config(path).gateway, model="m", served_name="m", urls=urls,
                          max_model_len=4096)
    assert {r.name: r.max_model_len for r in filled.models} == {"a": 4096, "b": 1024}  # a file's value wins


def test_routes_listed_in_the_file_keep_their_endpoints(tmp_path: Path) -> None:
    path = tmp_path / "up.yaml"
    path.write_text(
        "gateway:\n  models:\n  - name: local\n  - name: remote\n    endpoints: ['http://10.0.0.1:8000']\n"
    )
    settings = route_models(gateway=load_up_config(path).gateway, model="gemma-3-270m", served_name="gemma-3-270m",
                            urls=["http://127.0.0.1:8100"])
    assert {r.name: r.endpoints for r in settings.models} == {
        "local": ["http://127.0.0.1:8100"],
        "remote": ["http://10.0.0.1:8000"],
    }


def test_local_stack_is_local_mode_unless_the_file_asks_for_keys(tmp_path: Path) -> None:
    from fleetgate.local.config import load_up_config

    assert load_up_config(None).gateway.server.auth == "open"
    partial = tmp_path / "up.yaml"
    partial.write_text("gateway: {server: {port: 9090}}\n")
    assert load_up_config(partial).gateway.server.auth == "open"
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text("gateway: {server: {auth: api_key}}\n")
    assert load_up_config(keyed).gateway.server.auth == "api_key"


def test_kv_events_publish_on_ipc_beside_the_logs_and_reach_the_gateway(tmp_path: Path) -> None:
    import json

    from fleetgate.gateway.discovery import StaticEndpointSource
    from fleetgate.local.up import kv_event_routes
    from fleetgate.local.vllm_command import vllm_specs

    config = EngineConfig(replicas=2, base_port=9100, kv_events=True, log_dir=tmp_path)
    specs = vllm_specs(config=config, model_path=tmp_path / "model", python="py")
    for i, spec in enumerate(specs):
        kv = json.loads(spec.argv[spec.argv.index("--kv-events-config") + 1])
        assert kv["endpoint"] == spec.kv_publisher == f"ipc://{tmp_path.resolve()}/engine-{i}.kv"
        assert kv["replay_endpoint"] == spec.kv_replay and kv["enable_kv_cache_events"] is True
    settings = route_models(gateway=load_up_config(None).gateway, model="gemma-3-270m", served_name="gemma-3-270m",
                            urls=[s.url for s in specs], kv_events=kv_event_routes(specs))
    eps = StaticEndpointSource(settings.models).endpoints("gemma-3-270m")
    assert [e.labels["kv_events"] for e in eps] == [s.kv_publisher for s in specs]
    plain = vllm_specs(config=EngineConfig(log_dir=tmp_path), model_path=tmp_path, python="py")
    assert plain[0].kv_publisher is None and "--kv-events-config" not in plain[0].argv
    assert kv_event_routes(plain) == []
