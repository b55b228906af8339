"""Gateway settings: embedded defaults, strictness, URL normalisation, errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgate.core.config import load_model
from fleetgate.core.errors import ConfigError, UpstreamBadResponseError
from fleetgate.gateway.discovery import StaticEndpointSource, endpoint_id
from fleetgate.gateway.errors import from_engine
from fleetgate.gateway.settings import GatewaySettings


def test_defaults_work_without_a_file() -> None:
    s = load_model(GatewaySettings, None)
    assert (s.server.host, s.server.port, s.server.max_body_bytes) == ("127.0.0.1", 8080, 4 * 1024 * 1024)
    assert s.models == [] and s.discovery.kind == "static" and s.redis_url is None
    assert s.server.debug_headers is False
    assert s.server.auth == "api_key"  # auth off only by an explicit local-mode setting


def test_file_is_loaded_and_endpoints_normalised(tmp_path: Path) -> None:
    f = tmp_path / "gw.yaml"
    f.write_text("server: {port: 9000, debug_headers: true}\n"
                 "models:\n  - name: small\n    endpoints: ['http://10.0.0.1:8000/v1/', 'http://10.0.0.2:8000']\n"
                 "    served_name: org/small-v2\n")
    s = load_model(GatewaySettings, f)
    assert s.server.port == 9000 and s.server.debug_headers
    source = StaticEndpointSource(s.models)
    assert source.models() == ["small"]
    eps = source.endpoints("small")
    assert [e.url for e in eps] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert [e.id for e in eps] == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert {e.model for e in eps} == {"org/small-v2"}
    assert source.endpoints("unknown") == []


def test_kv_event_addresses_become_endpoint_labels(tmp_path: Path) -> None:
    f = tmp_path / "gw.yaml"
    f.write_text("models:\n  - name: small\n    endpoints: ['http://10.0.0.1:8000', 'http://10.0.0.2:8000/v1']\n"
                 "    kv_events:\n"
                 "      - {endpoint: 'http://10.0.0.2:8000/', publisher: 'tcp://10.0.0.2:5557',"
                 " replay: 'tcp://10.0.0.2:5558', topic: kv}\n")
    eps = StaticEndpointSource(load_model(GatewaySettings, f).models).endpoints("small")
    assert eps[0].labels == {}
    assert eps[1].labels == {"kv_events": "tcp://10.0.0.2:5557", "kv_events_replay": "tcp://10.0.0.2:5558",
                             "kv_events_topic": "kv"}


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("server: {prot: 1}\n", "server.prot"),
        ("bogus: 1\n", "bogus"),
        ("models: [{name: a, endpoints: ['10.0.0.1:80']}]\n", "models.0.endpoints"),
        ("models: [{name: a}, {name: a}]\n", "models"),
        ("discovery: {kind: consul}\n", "discovery.kind"),
        ("models: [{name: a, endpoints: ['http://e:1'], kv_events: [{endpoint: 'http://f:1', publisher: 'tcp://f:2'}]}]\n",
         "models.0"),
        ("models: [{name: a, endpoints: ['http://e:1'], kv_events: [{endpoint: 'http://e:1', publisher: 'e:2'}]}]\n",
         "models.0.kv_events.0.publisher"),
        ("models: [{name: a, endpoints: ['http://e:1'], kv_events: [{endpoint: 'http://e:1', publisher: 'ipc:///p',"
         " replay: 'http://e:3'}]}]\n", "models.0.kv_events.0.replay"),
    ],
)
def test_mistakes_are_config_errors_naming_the_field(tmp_path: Path, text: str, where: str) -> None:
    f = tmp_path / "gw.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_model(GatewaySettings, f)
    assert f"  {where}:" in str(info.value)


def test_endpoint_ids() -> None:
    assert endpoint_id("http://host") == "host:80"
    assert endpoint_id("https://host") == "host:443"


GENERIC_500 = "the engine failed (HTTP 500); details are in the gateway log under this request id"


@pytest.mark.parametrize(
    ("status", "body", "message", "code"),
    [
        (400, b'{"error": {"message": "too long", "type": "BadRequestError", "code": 400}}', "too long", "400"),
        (400, b'{"object": "error", "message": "flat vllm", "type": "x", "code": 400}', "flat vllm", "400"),
        (400, b'{"error": {"message": "bad\\nTraceback (most recent call last):\\n  File \\"/x.py\\""}}',
         "the engine refused the request (HTTP 400); details are in the gateway log under this request id", None),
        (400, b'{"error": {"message": "no such file at http://10.0.0.7:8000/x on 10.0.0.8:9"}}',
         "no such file at <url> on <address>", None),
        (500, b'{"error": {"message": "CUDA OOM in worker 10.0.0.7", "code": 500}}', GENERIC_500, "500"),
        (500, b"Internal Server Error", GENERIC_500, None),
        (500, b"", GENERIC_500, None),
    ],
)
def test_engine_errors_are_relayed_openai_shaped_and_sanitized(
    status: int, body: bytes, message: str, code: str | None
) -> None:
    err = from_engine(status, body, endpoint="e:1")
    assert err.status == status and err.message == message and err.code == code
    assert set(err.to_openai()["error"]) == {"message", "type", "param", "code"}
    assert not isinstance(err, UpstreamBadResponseError)
