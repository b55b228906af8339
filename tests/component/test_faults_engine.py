"""Fault suite, engine and client side: every case asserts what the tenant was charged against what the
engine processed, and that nothing leaked (budget counter equal to the ledger, the router's in-flight
count back to zero, one request record per request).

Engine faults (fake engine): death mid-stream, silence, garbage, malformed usage (a string, a list,
negative and absurd counts), 429 and 500. Client disconnects: before the response headers (prefill),
mid-stream, and while waiting for a non-streaming answer. Charged means the ledger (`/v1/usage`); the
engine's side is the last usage it sent (`RecordingEngine`), or for an engine whose usage is unknown
the gateway's documented estimate (prompt estimate + output chunks relayed), never $0.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest

from fleetgate.core.types import Usage
from fleetgate.gateway.estimate import estimate_request
from fleetgate.gateway.parsing import parse_request
from fleetgate.gateway.tenancy.config import ListPrice
from fleetgate.gateway.tenancy.pricing import cost_micros, list_rates
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

from .conftest import RunningGateway, eventually
from .test_tenancy_gateway import KEYS, PRICE, auth, settings
from .test_tenancy_redis import RecordingEngine

RATES = list_rates(ListPrice.model_validate(PRICE))
TENANTS = [{"id": "acme", "key_hashes": [KEYS["acme"][1]], "daily_budget_usd": "10", "tpm": 10**7}]
PROMPT = "alpha beta gamma delta epsilon"  # 5 words: the fake engine reports 5 prompt tokens


def body(*, stream: bool, max_tokens: int = 20, **extra: Any) -> dict[str, Any]:
    return {"model": "m1", "stream": stream, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": PROMPT}], **extra}


def prompt_estimate(b: dict[str, Any]) -> int:
    return estimate_request(parse_request("chat", orjson.dumps(b))).typical  # what unknown usage is charged


async def start(start_gateway: Callable[..., Awaitable[RunningGateway]], *, redis_url: str | None = None,
                **engine: Any) -> tuple[Any, RunningGateway]:
    config = FakeEngineConfig(model="m1", **engine)
    # RecordingEngine reads every answer as JSON: a garbage-sending engine is the plain fake one.
    eng = await (FakeEngine(config) if config.garbage else RecordingEngine(config)).start()
    gw = await start_gateway(settings(eng.url, tenants=TENANTS, redis_url=redis_url, inter_chunk_timeout_s=0.5,
                                      first_byte_timeout_s=5))
    return eng, gw


async def charged(gw: RunningGateway) -> tuple[dict[str, int], int]:
    """(ledger totals of acme, its daily budget counter) once every settle ran."""
    await gw.pipeline.drain()
    async with httpx.AsyncClient(base_url=gw.url) as c:
        totals = (await c.get("/v1/usage", headers=auth("admin"))).json()["totals"]
        budgets = (await c.get("/v1/usage/budgets", headers=auth("acme"))).json()
    return totals, budgets["data"][0]["windows"]["daily_budget"]["used"]


def in_flight(gw: RunningGateway) -> int:
    scheduler = gw.app.state.stages.scheduler
    state = getattr(scheduler, "state", None)
    return sum(state.inflight.values()) if state is not None else 0


async def check(gw: RunningGateway, expected: Usage, *, requests: int = 1) -> dict[str, int]:
    totals, counter = await charged(gw)
    assert (totals["prompt_tokens"], totals["completion_tokens"]) == (expected.prompt_tokens,
                                                                     expected.completion_tokens)
    assert totals["cost_micros"] == cost_micros(expected, RATES) == counter  # nothing leaked or lost
    assert totals["requests"] == requests
    assert in_flight(gw) == 0
    return totals


async def stream_all(gw: RunningGateway, b: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c, c.stream(
        "POST", "/v1/chat/completions", json=b, headers=auth("acme")
    ) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                out.append(line[6:] if line[6:] == "[DONE]" else orjson.loads(line[6:]))
    return out


async def post(gw: RunningGateway, b: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
        return await c.post("/v1/chat/completions", json=b, headers=auth("acme"))


# ---- engine faults ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_engine_dying_mid_answer_is_charged_what_it_generated(start_gateway: Any, stream: bool) -> None:
    engine, gw = await start(start_gateway, drop_after_chunks=3)
    if stream:
        out = await stream_all(gw, body(stream=True))
        assert out[-2]["error"]["code"] == "upstream_error"
    else:
        r = await post(gw, body(stream=False))
        assert r.status_code == 502 and r.json()["error"]["type"] == "server_error"
    [reported] = engine.usages()
    assert reported.completion_tokens == 3
    await check(gw, reported)


@pytest.mark.parametrize("stream", [True, False])
async def test_silent_engine_is_charged_what_it_generated(start_gateway: Any, stream: bool) -> None:
    engine, gw = await start(start_gateway, hang_after_chunks=2)
    if stream:
        out = await stream_all(gw, body(stream=True))
        assert out[-2]["error"]["code"] == "upstream_timeout"
    else:
        r = await post(gw, body(stream=False))
        assert r.status_code == 504
    assert await eventually(lambda: engine.stats.cancelled == 1)  # the gateway hung up on it
    [reported] = engine.usages()
    await check(gw, reported)


async def test_garbage_from_the_engine_is_a_502_charged_the_prompt_estimate(start_gateway: Any) -> None:
    _, gw = await start(start_gateway, garbage=True)
    b = body(stream=False)
    r = await post(gw, b)
    assert r.status_code == 502 and "error" in r.json()
    await check(gw, Usage(prompt_tokens=prompt_estimate(b)))  # usage unknown: never $0


@pytest.mark.parametrize("usage", ["12", [1, 2], {"prompt_tokens": -5, "completion_tokens": 3},
                                   {"prompt_tokens": 2**62, "completion_tokens": 1},
                                   {"prompt_tokens": "x", "completion_tokens": 2}])
@pytest.mark.parametrize("stream", [True, False])
async def test_malformed_usage_is_charged_by_estimate_and_breaks_nothing(
    start_gateway: Any, usage: Any, stream: bool
) -> None:
    _, gw = await start(start_gateway, usage_override=usage)
    b = body(stream=stream, max_tokens=6)
    if stream:
        out = await stream_all(gw, b)
        assert out[-1] == "[DONE]" and all("error" not in o for o in out[:-1])
        assert all("usage" not in o for o in out[:-1])  # not relayed either
    else:
        r = await post(gw, b)
        assert r.status_code == 200
        assert r.json()["usage"]["completion_tokens"] == 6  # the estimate, in a well-formed usage
    await check(gw, Usage(prompt_tokens=prompt_estimate(b), completion_tokens=6))
    async with httpx.AsyncClient() as c:
        metrics = (await c.get(gw.metrics_url)).text
    assert 'kind="bad_usage"' in metrics
    assert 'fleetgate_requests_total{cache="bypass",model="m1",status="200",tenant="acme",tier=""} 1.0' in metrics


@pytest.mark.parametrize("status", [429, 500])
@pytest.mark.parametrize("stream", [True, False])
async def test_engine_refusals_cost_nothing_and_release_the_reservation(
    start_gateway: Any, status: int, stream: bool
) -> None:
    _, gw = await start(start_gateway, fail_status=status)
    r = await post(gw, body(stream=stream))
    assert r.status_code == status
    totals = await check(gw, Usage())
    assert totals["errors"] == 1


# ---- client disconnects -----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_client_leaving_before_the_headers_is_charged_the_prompt_estimate(
    start_gateway: Any, stream: bool
) -> None:
    engine, gw = await start(start_gateway, prefill_delay_s=30)
    b = body(stream=stream)
    async with httpx.AsyncClient(base_url=gw.url) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post("/v1/chat/completions", json=b, headers=auth("acme"), timeout=0.5)
    assert await eventually(lambda: engine.stats.cancelled == 1)
    # The engine had the prompt (its prefill was under way) and reported nothing: the estimate.
    await check(gw, Usage(prompt_tokens=prompt_estimate(b)))


async def test_client_leaving_mid_stream_is_charged_what_the_engine_generated(start_gateway: Any) -> None:
    engine, gw = await start(start_gateway, hang_after_chunks=4)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c, c.stream(
        "POST", "/v1/chat/completions", json=body(stream=True), headers=auth("acme")
    ) as r:
        async for line in r.aiter_lines():
            if '"t3 "' in line:
                break
    assert await eventually(lambda: engine.stats.cancelled == 1)
    [reported] = engine.usages()
    assert reported.completion_tokens == 4
    await check(gw, reported)


async def test_client_leaving_a_non_streaming_wait_is_charged_what_the_engine_generated(
    start_gateway: Any,
) -> None:
    """The defect: recorded as 499 with empty usage and refunded. The gateway streams from the engine and
    assembles the answer, so it knows the engine's usage at the moment the client left."""
    engine, gw = await start(start_gateway, hang_after_chunks=5)
    async with httpx.AsyncClient(base_url=gw.url) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post("/v1/chat/completions", json=body(stream=False), headers=auth("acme"), timeout=0.5)
    assert await eventually(lambda: engine.stats.cancelled == 1)
    [reported] = engine.usages()
    assert reported.completion_tokens == 5
    totals = await check(gw, reported)
    assert totals["errors"] == 1  # a 499


async def test_non_streaming_answers_are_assembled_from_an_engine_stream(start_gateway: Any) -> None:
    engine, gw = await start(start_gateway)
    r = await post(gw, body(stream=False, max_tokens=3, n=2))
    assert r.status_code == 200
    got = r.json()
    assert [c["message"]["content"] for c in got["choices"]] == ["t0 t1 t2 "] * 2
    assert got["usage"]["completion_tokens"] == 6 and got["object"] == "chat.completion"
    sent = engine.received[-1].body
    assert sent["stream"] is True and sent["stream_options"]["continuous_usage_stats"] is True
    await check(gw, Usage(prompt_tokens=5, completion_tokens=6))
    # Requests the assembler cannot rebuild go upstream as they came.
    await post(gw, body(stream=False, max_tokens=3, logprobs=True))
    assert "stream_options" not in engine.received[-1].body


async def test_many_disconnects_at_random_stages_lose_no_spend(start_gateway: Any) -> None:
    """A bounded mix of 20 requests whose clients leave at every stage (prefill, mid-stream, mid-wait)."""
    engine, gw = await start(start_gateway, inter_token_delay_s=0.01, prefill_delay_s=0.02)

    async def one(i: int) -> None:
        b = body(stream=bool(i % 2), max_tokens=30)
        async with httpx.AsyncClient(base_url=gw.url) as c:
            with contextlib.suppress(httpx.TimeoutException):
                await c.post("/v1/chat/completions", json=b, headers=auth("acme"), timeout=0.01 + 0.03 * (i % 5))

    await asyncio.gather(*(one(i) for i in range(20)))
    assert await eventually(lambda: engine.stats.running == 0, timeout_s=10)
    totals, counter = await charged(gw)
    reported = engine.usages()
    assert engine.stats.cancelled > 0 and totals["requests"] >= engine.stats.requests
    # Each request is charged the engine's last usage that reached the gateway (relayed or still
    # buffered), else the prompt estimate. A token the engine writes after the gateway hung up (before it
    # sees the abort) never reaches the gateway: at most one per aborted request here (10 ms per token).
    missing = sum(u.completion_tokens for u in reported) - totals["completion_tokens"]
    assert missing <= engine.stats.cancelled
    assert totals["prompt_tokens"] >= sum(u.prompt_tokens for u in reported)  # never less than the engine read
    assert totals["prompt_tokens"] <= engine.stats.requests * prompt_estimate(body(stream=False, max_tokens=30))
    assert totals["cost_micros"] == counter
    assert in_flight(gw) == 0


# ---- what a client sees of a failing engine ---------------------------------------------------------


def _closed_port_url() -> str:
    import socket

    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("fault", ["dead", "drop", "hang", "garbage"])
async def test_engine_failures_show_clients_no_address_or_traceback(
    start_gateway: Any, fault: str, stream: bool
) -> None:
    """Engine endpoints are internal (pod IPs, ports): failures name the model, never the endpoint, and the
    details go to the gateway log."""
    if fault == "dead":
        url = _closed_port_url()
        gw = await start_gateway(settings(url, tenants=TENANTS, first_byte_timeout_s=5))
    else:
        config = {"drop": {"drop_after_chunks": 1}, "hang": {"hang_after_chunks": 1},
                  "garbage": {"garbage": True}}[fault]
        engine, gw = await start(start_gateway, **config)
        url = engine.url
    port = url.rsplit(":", 1)[1]
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
        r = await c.post("/v1/chat/completions", json=body(stream=stream), headers=auth("acme"))
    text = r.text
    assert "error" in text
    assert "127.0.0.1" not in text and port not in text and "Traceback" not in text, text
