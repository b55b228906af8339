"""`fleetgate_gateway_own_seconds`: the gateway's own time on a request sent to an engine, per phase, through a real
gateway (uvicorn) in front of the fake engine. The engine's own time (its prefill, here a fixed delay before its
response headers and first token) must be in no phase; each phase is observed once per request; cache hits are not
counted."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from fleetgate.cache.config import CacheConfig
from fleetgate.gateway.own_time import PHASES
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway, eventually, settings_for

PREFILL_S = 0.25  # the fake engine's time before its answer starts: the gateway must not count it as its own


def chat(*, stream: bool, text: str = "a b c") -> dict[str, Any]:
    return {"model": "m1", "messages": [{"role": "user", "content": text}], "max_tokens": 3, "stream": stream,
            "temperature": 0}


def own(gw: RunningGateway) -> dict[str, tuple[float, float]]:
    """(count, sum in seconds) of each phase, from the gateway's registry."""
    registry = gw.app.state.metrics.registry
    out = {}
    for phase in PHASES:
        count = registry.get_sample_value("fleetgate_gateway_own_seconds_count", {"phase": phase})
        total = registry.get_sample_value("fleetgate_gateway_own_seconds_sum", {"phase": phase})
        out[phase] = (count or 0.0, total or 0.0)
    return out


async def streamed(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, float]:
    """(time to the first data line, whole request time), seconds, as the client saw them."""
    t0 = time.perf_counter()
    first = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - t0
    assert first is not None
    return first, time.perf_counter() - t0


@pytest.fixture
async def slow_engine(start_engine: Callable[..., Awaitable[FakeEngine]]) -> FakeEngine:
    return await start_engine(model="m1", prefill_delay_s=PREFILL_S, inter_token_delay_s=0.01)


async def test_a_streamed_request_is_counted_once_per_phase_without_the_engines_time(
    slow_engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    gw = await start_gateway(settings_for({"m1": [slow_engine.url]}))
    assert own(gw) == {p: (0.0, 0.0) for p in PHASES}
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        ttft, whole = await streamed(client, chat(stream=True))
    seen = own(gw)
    assert {p: c for p, (c, _) in seen.items()} == {p: 1.0 for p in PHASES}
    before, stages, write, first, total = (seen[p][1] for p in PHASES)
    assert ttft > PREFILL_S  # the engine's prefill is on the client's path ...
    assert 0 < before < PREFILL_S / 2 and 0 < first < PREFILL_S / 2  # ... and in neither phase
    assert stages > 0 and write > 0 and stages + write == pytest.approx(before, abs=1e-6)  # its split
    assert total == pytest.approx(before + first, abs=1e-6)
    assert total < ttft < whole


async def test_an_unstreamed_request_counts_before_upstream_alone(
    slow_engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    gw = await start_gateway(settings_for({"m1": [slow_engine.url]}))
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        t0 = time.perf_counter()
        r = await client.post("/v1/chat/completions", json=chat(stream=False))
        whole = time.perf_counter() - t0
    assert r.status_code == 200
    seen = own(gw)
    assert seen["before_upstream"][0] == 1 and 0 < seen["before_upstream"][1] < min(PREFILL_S / 2, whole)
    assert seen["stages"][0] == seen["upstream_write"][0] == 1
    assert seen["first_chunk"] == seen["total_to_first_byte"] == (0.0, 0.0)


async def test_cache_hits_and_refused_requests_are_not_counted(
    engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    settings = settings_for({"m1": [engine.url]}).model_copy(update={"cache": CacheConfig(store_truncated=True)})
    gw = await start_gateway(settings)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        await streamed(client, chat(stream=True, text="once"))
        assert await eventually(lambda: len(gw.pipeline._s.cache.index) == 1)  # type: ignore[attr-defined]
        replayed = await client.post("/v1/chat/completions", json=chat(stream=True, text="once"))
        assert replayed.headers["x-fleetgate-cache"] == "hit-exact"
        unknown = await client.post("/v1/chat/completions", json={**chat(stream=True), "model": "nope"})
        assert unknown.status_code == 404
    assert {p: c for p, (c, _) in own(gw).items()} == {p: 1.0 for p in PHASES}  # the first request alone


# ---- the other APIs' doors: `/v1/responses` and `/v1/messages` (`api_pipeline`, `event_relay`) ----------------

API_PATHS = {"responses": "/v1/responses", "messages": "/v1/messages"}


def api_body(api: str, *, stream: bool, text: str = "a b c", model: str = "m1") -> dict[str, Any]:
    if api == "responses":
        return {"model": model, "input": text, "max_output_tokens": 3, "stream": stream, "temperature": 0}
    return {"model": model, "max_tokens": 3, "messages": [{"role": "user", "content": text}], "stream": stream,
            "temperature": 0}


async def api_streamed(client: httpx.AsyncClient, api: str, body: dict[str, Any]) -> tuple[float, list[str]]:
    """(time to the first event's data line, seconds; the stream's lines)."""
    t0 = time.perf_counter()
    first = None
    lines = []
    async with client.stream("POST", API_PATHS[api], json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            lines.append(line)
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - t0
    assert first is not None
    return first, lines


def counts(gw: RunningGateway) -> dict[str, float]:
    return {p: c for p, (c, _) in own(gw).items()}


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_the_other_apis_count_each_phase_once_per_engine_request_without_the_engines_time(
    api: str, slow_engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    gw = await start_gateway(settings_for({"m1": [slow_engine.url]}))
    streams = 2
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        ttfts = []
        for i in range(streams):
            ttft, lines = await api_streamed(client, api, api_body(api, stream=True, text=f"a b c {i}"))
            terminal = "event: response.completed" if api == "responses" else "event: message_stop"
            assert terminal in lines  # the whole answer was relayed
            ttfts.append(ttft)
        seen = own(gw)
        assert counts(gw) == {p: float(streams) for p in PHASES}
        before, stages, write, first, total = (seen[p][1] for p in PHASES)
        assert min(ttfts) > PREFILL_S  # the engine's prefill is on the client's path ...
        assert 0 < before < PREFILL_S / 2 and 0 < first < PREFILL_S / 2  # ... and in neither phase
        assert stages + write == pytest.approx(before, abs=1e-6)
        assert total == pytest.approx(before + first, abs=1e-6) and total < sum(ttfts)
        # a client that does not stream: the engine still streams (collected here), but no chunk is handed on
        r = await client.post(API_PATHS[api], json=api_body(api, stream=False, text="d e f"))
        assert r.status_code == 200, r.text
    after = own(gw)
    assert counts(gw) == {"before_upstream": 3.0, "stages": 3.0, "upstream_write": 3.0, "first_chunk": 2.0,
                          "total_to_first_byte": 2.0}
    assert 0 < after["before_upstream"][1] - before < PREFILL_S / 2
    assert after["first_chunk"] == seen["first_chunk"] and after["total_to_first_byte"] == seen["total_to_first_byte"]


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_the_other_apis_cache_hits_and_refused_requests_are_not_counted(
    api: str, engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    settings = settings_for({"m1": [engine.url]}).model_copy(update={"cache": CacheConfig(store_truncated=True)})
    gw = await start_gateway(settings)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        await api_streamed(client, api, api_body(api, stream=True, text="once"))
        assert await eventually(lambda: len(gw.pipeline._s.cache.index) == 1)  # type: ignore[attr-defined]
        for stream in (True, False):
            replayed = await client.post(API_PATHS[api], json=api_body(api, stream=stream, text="once"))
            assert replayed.status_code == 200 and replayed.headers["x-fleetgate-cache"] == "hit-exact"
            unknown = await client.post(API_PATHS[api], json=api_body(api, stream=stream, model="nope"))
            assert unknown.status_code == 404
            invalid = await client.post(API_PATHS[api], json={**api_body(api, stream=stream), "temperature": "hot"})
            assert invalid.status_code == 400
    assert engine.stats.requests == 1
    assert counts(gw) == {p: 1.0 for p in PHASES}  # the first request alone
