"""Chat, completions, models, health and request ids through a gateway on a real uvicorn server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx

from fleetgate.core.localredis import free_port
from fleetgate.gateway.settings import ModelRoute
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway, settings_for

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hello there friend"}], "max_tokens": 3}


async def test_chat_completion_is_relayed_with_usage_and_headers(gateway: RunningGateway, engine: FakeEngine) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "t0 t1 t2 "
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert body["model"] == "m1"
    assert r.headers["x-fleetgate-model"] == "m1"
    assert r.headers["x-fleetgate-cache"] == "bypass"
    assert len(r.headers["x-request-id"]) >= 16
    assert "x-fleetgate-endpoint" not in r.headers  # debug headers are off by default
    assert engine.received[-1].path == "/v1/chat/completions"


async def test_completions_endpoint(gateway: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        r = await client.post("/v1/completions", json={"model": "m1", "prompt": "one two", "max_tokens": 2})
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"] == "t0 t1 "
    assert r.json()["usage"]["prompt_tokens"] == 2


async def test_client_request_id_is_echoed(gateway: RunningGateway, engine: FakeEngine) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "my-id-42"})
        bad = await client.post("/v1/chat/completions", content=b"{", headers={"x-request-id": "err-id"})
    assert r.headers["x-request-id"] == "my-id-42"
    assert engine.received[-1].headers["x-request-id"] == "my-id-42"
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "err-id"


async def test_models_lists_configured_models(start_gateway, engine: FakeEngine) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(settings_for({"m1": [engine.url], "m2": [engine.url]}))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.get("/v1/models")
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["m1", "m2"]


async def test_health_and_readiness(start_gateway, gateway: RunningGateway) -> None:  # type: ignore[no-untyped-def]
    empty = await start_gateway(settings_for({"m1": [], "m2": []}))
    async with httpx.AsyncClient() as client:
        assert (await client.get(gateway.url + "/healthz")).status_code == 200
        ready = await client.get(gateway.url + "/readyz")
        no_engines = await client.get(empty.url + "/readyz")
    assert (ready.status_code, ready.json()) == (
        200, {"status": "ready", "models": 1, "endpoints": 1, "ejected": 0, "all_ejected": False}
    )
    # ready without engines: it answers (503s naming the problem); the body tells
    assert (no_engines.status_code, no_engines.json()) == (
        200, {"status": "ready", "models": 2, "endpoints": 0, "ejected": 0, "all_ejected": False}
    )


async def test_readiness_counts_ejected_endpoints_and_names_them_only_to_the_admin(start_gateway) -> None:  # type: ignore[no-untyped-def]
    """Every endpoint ejected (its engine is down): /readyz still answers 200 and says so, so a probe can
    treat "all ejected" as not ready. The addresses (pod IPs under Kubernetes discovery) are not for anyone
    who can reach the client port: only the admin key, and the metrics port's ejected gauge, name them."""
    from .test_tenancy_gateway import auth, settings

    # A port held bound but never listening: connections are refused, and no other server on this machine can
    # take it meanwhile (a port only found free once was taken by another test's server and answered 401).
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    dead_port = holder.getsockname()[1]
    with holder:
        gw = await start_gateway(settings(f"http://127.0.0.1:{dead_port}"))
        async with httpx.AsyncClient(base_url=gw.url) as client:
            failed = await client.post("/v1/chat/completions", json=CHAT, headers=auth("acme"))
            anonymous = await client.get("/readyz")
            tenant = await client.get("/readyz", headers=auth("acme"))
            wrong = await client.get("/readyz", headers={"Authorization": "Bearer fg-wrong"})
            admin = (await client.get("/readyz", headers=auth("admin"))).json()
            gauge = (await client.get(gw.metrics_url)).text
    assert failed.status_code >= 500
    for r in (anonymous, tenant, wrong):
        assert r.status_code == 200 and str(dead_port) not in r.text and "127.0.0.1" not in r.text
        assert r.json() == {"status": "ready", "models": 2, "endpoints": 2, "ejected": 2, "all_ejected": True}
    assert admin["ejected_endpoints"] == [f"127.0.0.1:{dead_port}"] * 2  # m1 and m2 share the engine
    assert f'fleetgate_router_endpoint_ejected{{endpoint="127.0.0.1:{dead_port}"}} 1.0' in gauge


async def test_not_ready_before_start(engine: FakeEngine) -> None:
    from fleetgate.gateway.app import create_app

    app = create_app(settings_for({"m1": [engine.url]}))
    transport = httpx.ASGITransport(app=app)  # no lifespan: the app was never started
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        r = await client.get("/readyz")
        c = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and r.json()["status"] == "starting"
    assert c.status_code == 503 and "not started" in c.json()["error"]["message"]


async def test_served_name_differs_from_public_name(start_gateway, engine: FakeEngine) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for({})
    settings.models.append(ModelRoute(name="public", endpoints=[engine.url], served_name="engine-name"))
    gw = await start_gateway(settings)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "public"})
    assert r.status_code == 200
    assert engine.received[-1].body["model"] == "engine-name"
    assert r.json()["model"] == "public"


def test_fleetgate_gateway_command_serves_from_a_config_file(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "gw.yaml"
    config.write_text("server: {port: 1, auth: open}\nmodels: [{name: m1, endpoints: ['http://127.0.0.1:9']}]\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetgate", "gateway", "--config", str(config), "--port", str(port),
         "--metrics-port", "0"],
        env={**os.environ, "PYTHONSAFEPATH": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        body = None
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1) as r:
                    body = r.read()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.05)
        assert body is not None and b'"id":"m1"' in body
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert b"Application shutdown complete" in err  # graceful stop on SIGTERM (lifespan ran)


def test_fleetgate_gateway_command_reports_config_errors(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text("server: {prot: 1}\n")
    result = subprocess.run(
        [sys.executable, "-m", "fleetgate", "gateway", "--config", str(config)],
        env={**os.environ, "PYTHONSAFEPATH": "1"}, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "server.prot" in result.stderr
