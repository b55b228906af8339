"""Every error path answers OpenAI-shaped JSON with the right status, a request id, and never a 500."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from fleetgate.core.localredis import free_port
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway, eventually, settings_for

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers["x-request-id"]
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    return error


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "m1"}', "messages"),
        (b'{"model": "m1", "messages": []}', "messages"),
        (b'{"model": "m1", "messages": ["x"]}', "messages[0]"),
        (b'{"model": "m1", "messages": [{"role": "user"}], "stream": "yes"}', "stream"),
        (b'{"model": "m1", "messages": [{"role": "user"}], "max_tokens": -1}', "max_tokens"),
        (b'{"model": "m1", "messages": [{"role": "user"}], "stream_options": {"include_usage": true}}',
         "stream_options"),
    ],
)
async def test_invalid_body_is_400(gateway: RunningGateway, raw: bytes, param: str | None) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        r = await client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    error = assert_openai_error(r, 400, "invalid_request")
    assert error["param"] == param


async def test_unknown_model_is_404_naming_valid_models(gateway: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
    error = assert_openai_error(r, 404, "model_not_found")
    assert "'nope'" in error["message"] and "m1" in error["message"]


async def test_body_too_large_is_413_by_header_and_by_bytes(start_gateway, engine: FakeEngine) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(settings_for({"m1": [engine.url]}, max_body_bytes=1000))
    big = b'{"model": "m1", "prompt": "' + b"x" * 2000 + b'"}'

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the bytes read are counted
        for i in range(0, len(big), 100):
            yield big[i : i + 100]

    async with httpx.AsyncClient(base_url=gw.url) as client:
        by_header = await client.post("/v1/completions", content=big)
        by_bytes = await client.post("/v1/completions", content=chunked())
        small = await client.post("/v1/completions", json={"model": "m1", "prompt": "ok", "max_tokens": 1})
    assert_openai_error(by_header, 413, "request_too_large")
    assert_openai_error(by_bytes, 413, "request_too_large")
    assert small.status_code == 200
    assert len(engine.received) == 1


async def test_engine_unreachable_is_503(start_gateway) -> None:  # type: ignore[no-untyped-def]
    dead = f"http://127.0.0.1:{free_port()}"
    gw = await start_gateway(settings_for({"m1": [dead]}))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        s = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    for resp in (r, s):
        error = assert_openai_error(resp, 503, "upstream_unavailable")
        assert "cannot connect" in error["message"]


async def test_model_without_endpoints_is_503(start_gateway) -> None:  # type: ignore[no-untyped-def]
    gw = await start_gateway(settings_for({"m1": []}))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
    assert "no endpoint serves model 'm1'" in assert_openai_error(r, 503)["message"]


async def test_bad_engine_response_is_502(start_engine, start_gateway) -> None:  # type: ignore[no-untyped-def]
    engine = await start_engine(model="m1", garbage=True)
    gw = await start_gateway(settings_for({"m1": [engine.url]}))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
    assert_openai_error(r, 502, "bad_gateway")


@pytest.mark.parametrize("stream", [False, True])
async def test_engine_timeout_is_504(start_engine, start_gateway, stream: bool) -> None:  # type: ignore[no-untyped-def]
    engine = await start_engine(model="m1", prefill_delay_s=2.0)
    gw = await start_gateway(settings_for({"m1": [engine.url]}, request_timeout_s=0.2, first_byte_timeout_s=0.2))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    if stream:  # the engine sends its headers at once: the silence is reported in the stream
        assert r.status_code == 200
        assert '"code":"upstream_timeout"' in r.text and r.text.endswith("data: [DONE]\n\n")
    else:
        assert_openai_error(r, 504, "upstream_timeout")


@pytest.mark.parametrize(("status", "stream"), [(400, False), (500, False), (422, True), (503, True)])
async def test_engine_error_status_is_relayed(start_engine, start_gateway, status: int, stream: bool) -> None:  # type: ignore[no-untyped-def]
    engine = await start_engine(model="m1", fail_status=status, fail_message="engine says no")
    gw = await start_gateway(settings_for({"m1": [engine.url]}))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    error = assert_openai_error(r, status)
    # A 4xx keeps the engine's (safe) message; a 5xx's details stay in the gateway log.
    assert error["message"] == "engine says no" if status < 500 else "HTTP 5" in error["message"]
    assert r.headers["x-fleetgate-model"] == "m1"


async def test_unknown_route_is_openai_shaped_404(gateway: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        r = await client.get("/v1/nothing")
    assert_openai_error(r, 404)


async def test_client_leaving_a_non_streaming_request_aborts_the_engine_call(start_engine, start_gateway) -> None:  # type: ignore[no-untyped-def]
    engine = await start_engine(model="m1", prefill_delay_s=30)
    gw = await start_gateway(settings_for({"m1": [engine.url]}))
    async with httpx.AsyncClient(base_url=gw.url, timeout=0.5) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/chat/completions", json=CHAT)
    assert await eventually(lambda: engine.stats.cancelled == 1)
    await gw.pipeline.drain()
    async with httpx.AsyncClient(base_url=gw.url) as client:
        metrics = (await client.get(gw.metrics_url)).text
    assert 'fleetgate_requests_total{cache="bypass",model="m1",status="499",tenant="anonymous",tier=""} 1.0' in metrics
    assert "fleetgate_requests_in_flight 0.0" in metrics
