"""Streaming through the gateway: relayed as produced, usage handling, disconnects and broken engines."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from fleetgate.gateway.stages import RequestRecord
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway, eventually, settings_for


def chat(max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"model": "m1", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": max_tokens,
            "stream": True, **extra}


async def events(response: httpx.Response) -> AsyncIterator[bytes]:
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            yield line[6:].encode()


async def collect(url: str, body: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    async with httpx.AsyncClient(base_url=url) as client, client.stream(
        "POST", "/v1/chat/completions", json=body
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for data in events(r):
            out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


class Ledger:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    async def record(self, record: RequestRecord) -> None:
        self.records.append(record)


async def test_first_chunk_arrives_before_the_engine_finished(start_engine, start_gateway) -> None:  # type: ignore[no-untyped-def]
    engine: FakeEngine = await start_engine(model="m1", inter_token_delay_s=0.15)
    gw = await start_gateway(settings_for({"m1": [engine.url]}))
    async with httpx.AsyncClient(base_url=gw.url) as client, client.stream(
        "POST", "/v1/chat/completions", json=chat(max_tokens=6)
    ) as r:
        seen = []
        async for data in events(r):
            if data == b"[DONE]":
                break
            chunk = orjson.loads(data)
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                seen.append((chunk["choices"][0]["delta"]["content"], engine.stats.completed))
    assert [s[0] for s in seen] == [f"t{i} " for i in range(6)]
    assert seen[0][1] == 0, "the first token reached the client only after the engine had finished: buffered"
    assert engine.stats.completed == 1


async def test_usage_is_forced_upstream_and_stripped_for_the_client(
    engine: FakeEngine, gateway: RunningGateway
) -> None:
    out = await collect(gateway.url, chat(max_tokens=3))
    assert engine.received[-1].body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert out[-1] == "[DONE]"
    chunks = out[:-1]
    assert all("usage" not in c for c in chunks)
    assert all(c["choices"] for c in chunks)  # no usage-only chunk either
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "t0 t1 t2 "


async def test_include_usage_gives_one_final_usage_chunk(engine: FakeEngine, gateway: RunningGateway) -> None:
    out = await collect(gateway.url, chat(max_tokens=3, stream_options={"include_usage": True}))
    chunks = out[:-1]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


async def test_continuous_usage_when_asked(engine: FakeEngine, gateway: RunningGateway) -> None:
    body = chat(max_tokens=3, stream_options={"include_usage": True, "continuous_usage_stats": True})
    out = await collect(gateway.url, body)
    assert [c["usage"]["completion_tokens"] for c in out[:-1]] == [0, 1, 2, 3, 3]


async def test_completions_stream(engine: FakeEngine, gateway: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client, client.stream(
        "POST", "/v1/completions", json={"model": "m1", "prompt": "x y", "max_tokens": 2, "stream": True}
    ) as r:
        texts = [orjson.loads(d)["choices"][0]["text"] async for d in events(r) if d != b"[DONE]"]
    assert texts == ["t0 ", "t1 "]


async def test_client_disconnect_cancels_upstream_and_still_accounts(start_engine, start_gateway) -> None:  # type: ignore[no-untyped-def]
    engine: FakeEngine = await start_engine(model="m1", inter_token_delay_s=0.05)
    ledger = Ledger()
    gw = await start_gateway(settings_for({"m1": [engine.url]}), accountant=ledger)
    async with httpx.AsyncClient(base_url=gw.url) as client, client.stream(
        "POST", "/v1/chat/completions", json=chat(max_tokens=200)
    ) as r:
        got = 0
        async for data in events(r):
            if orjson.loads(data)["choices"][0]["delta"].get("content"):
                got += 1
            if got == 3:
                break
    assert await eventually(lambda: engine.stats.cancelled == 1)
    assert engine.stats.completed == 0
    await gw.pipeline.drain()
    assert await eventually(lambda: bool(ledger.records))
    [record] = ledger.records
    assert record.status == 499
    assert record.stream
    assert 3 <= record.usage.completion_tokens < 200
    assert record.usage.prompt_tokens == 3


async def test_engine_dying_mid_stream_ends_with_an_error_event(start_engine, start_gateway) -> None:  # type: ignore[no-untyped-def]
    engine: FakeEngine = await start_engine(model="m1", drop_after_chunks=2)
    gw = await start_gateway(settings_for({"m1": [engine.url]}))
    out = await collect(gw.url, chat(max_tokens=5))
    assert out[-1] == "[DONE]"
    assert out[-2]["error"]["code"] == "upstream_error"
    assert "closed the stream" in out[-2]["error"]["message"] or "broke off" in out[-2]["error"]["message"]
    async with httpx.AsyncClient(base_url=gw.url) as client:
        metrics = (await client.get(gw.metrics_url)).text
    assert 'fleetgate_upstream_errors_total{endpoint="' in metrics and 'kind="midstream"' in metrics


async def test_silent_engine_times_out_mid_stream(start_engine, start_gateway) -> None:  # type: ignore[no-untyped-def]
    engine: FakeEngine = await start_engine(model="m1", hang_after_chunks=1)
    gw = await start_gateway(settings_for({"m1": [engine.url]}, inter_chunk_timeout_s=0.3))
    started = time.monotonic()
    out = await collect(gw.url, chat(max_tokens=5))
    assert time.monotonic() - started < 3
    assert out[-1] == "[DONE]"
    assert out[-2]["error"]["code"] == "upstream_timeout"
    assert out[-3]["choices"][0]["delta"]["content"] == "t0 "


async def test_ttft_and_tpot_metrics_have_model_tier_tenant_labels(engine: FakeEngine, gateway: RunningGateway) -> None:
    await collect(gateway.url, chat(max_tokens=4))
    await gateway.pipeline.drain()
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        metrics = (await client.get(gateway.metrics_url)).text
    labels = 'model="m1",tenant="anonymous",tier=""'
    assert f"fleetgate_time_to_first_token_seconds_count{{{labels}}} 1.0" in metrics
    assert f"fleetgate_time_per_output_token_seconds_count{{{labels}}} 1.0" in metrics
    assert 'fleetgate_requests_total{cache="bypass",model="m1",status="200",tenant="anonymous",tier=""} 1.0' in metrics
    assert "fleetgate_requests_in_flight 0.0" in metrics


async def test_client_leaving_during_prefill_cancels_upstream_at_once(start_engine, start_gateway) -> None:  # type: ignore[no-untyped-def]
    engine: FakeEngine = await start_engine(model="m1", prefill_delay_s=30)
    gw = await start_gateway(settings_for({"m1": [engine.url]}))
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=gw.url) as client, client.stream(
        "POST", "/v1/chat/completions", json=chat()
    ) as r:
        assert r.status_code == 200  # headers came, no token yet: the client gives up
    assert await eventually(lambda: engine.stats.cancelled == 1)
    assert time.monotonic() - started < 10
    await gw.pipeline.drain()
    async with httpx.AsyncClient(base_url=gw.url) as client:
        metrics = (await client.get(gw.metrics_url)).text
    assert 'fleetgate_requests_total{cache="bypass",model="m1",status="499",tenant="anonymous",tier=""} 1.0' in metrics
