"""`fleetgate up --embedder engine`: the encoder engine's command and the gateway settings that point at it."""

from __future__ import annotations

import argparse
from pathlib import Path

from fleetgate.core.config import parse_model
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.local.config import UpConfig
from fleetgate.local.encoder_engine import EncoderEngineConfig, encoder_spec, with_encoder
from fleetgate.local.up import add_arguments, apply_overrides, route_models


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_flag_turns_the_encoder_on_and_the_file_can_too() -> None:
    assert not apply_overrides(UpConfig(), _args()).encoder.enabled
    assert apply_overrides(UpConfig(), _args("--embedder", "engine")).encoder.enabled
    on = UpConfig.model_validate({"encoder": {"enabled": True, "threads": 2}})
    assert apply_overrides(on, _args()).encoder.threads == 2
    assert not apply_overrides(on, _args("--embedder", "in-process")).encoder.enabled


def test_the_encoder_runs_minilm_with_the_operators_pooling_flags(tmp_path: Path) -> None:
    spec = encoder_spec(EncoderEngineConfig(log_dir=tmp_path, threads=1))
    argv = list(spec.argv)
    assert argv[argv.index("--runner") + 1] == "pooling" and argv[argv.index("--dtype") + 1] == "float32"
    model = Path(argv[argv.index("--model") + 1])
    assert (model / "config.json").is_file() and (model / "model.safetensors").is_file()  # the packaged weights
    assert spec.expect_model == "all-minilm-l6-v2" and spec.log_path == tmp_path / "encoder.log"
    assert spec.env["OMP_NUM_THREADS"] == "1" and spec.env["HF_HUB_OFFLINE"] == "1"


def test_the_gateway_cache_points_at_the_engine_and_keeps_the_files_settings() -> None:
    config = EncoderEngineConfig(timeout_ms=500)
    routed = route_models(gateway=GatewaySettings(), model="gemma", served_name="gemma", urls=["http://127.0.0.1:1"])
    off = parse_model(GatewaySettings, with_encoder(routed.model_dump(), url="http://127.0.0.1:9", config=config),
                      source="test")
    assert off.cache.enabled and off.cache.store_truncated  # the file left the cache off: turned on
    assert (off.cache.semantic.embedder, off.cache.semantic.remote.url, off.cache.semantic.remote.timeout_ms) == (
        "remote", "http://127.0.0.1:9", 500)
    assert [(m.name, m.task) for m in off.models] == [("gemma", "generate"), ("all-minilm-l6-v2", "embed")]
    mine = GatewaySettings.model_validate({"cache": {"enabled": True, "ttl_s": 60, "semantic": {"threshold": 0.6}}})
    kept = parse_model(GatewaySettings, with_encoder(mine.model_dump(), url="http://127.0.0.1:9", config=config),
                       source="test")
    assert kept.cache.ttl_s == 60 and kept.cache.semantic.threshold == 0.6 and not kept.cache.store_truncated
    assert kept.cache.semantic.embedder == "remote"
