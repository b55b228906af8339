"""Fault and abuse suite for `/v1/responses`, `/v1/messages` and `/v1/embeddings`: every case asserts what the tenant
was charged against what the engine processed (the fake engine's own counts), and that nothing leaked (budget
counter equal to the ledger, the router's in-flight count back to zero).

The rule a broken or abandoned event stream is charged by (`api_events.charged_events`): the engine's final usage
when it came; else the prompt the engine reported (Messages: `message_start`) or the request's prompt estimate
(Responses: vLLM reports usage only with `response.completed`), and one token per output delta that reached the
gateway. Faults: clients that leave mid-stream, during a non-streaming wait and before the headers; engines that
die, go silent, refuse, report malformed usage or stream past the output limit. Abuse: hostile input items and
content blocks, and a budget raced from three gateway replicas on one Redis with all three routes.
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
from fleetgate.gateway.api_messages import MessagesRoute
from fleetgate.gateway.api_responses import ResponsesRoute
from fleetgate.gateway.conversations import ConversationStore
from fleetgate.gateway.estimate import estimate_body
from fleetgate.gateway.tenancy.pricing import cost_micros
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

from .conftest import RunningGateway, eventually
from .test_faults_engine import RATES, TENANTS, charged, in_flight
from .test_tenancy_gateway import KEYS, auth, settings

Start = Callable[..., Awaitable[Any]]
PROMPT = "alpha beta gamma delta epsilon"  # 5 words: the fake engine reads 5 prompt tokens
ROUTES = {"responses": ResponsesRoute(store=ConversationStore.__new__(ConversationStore)), "messages": MessagesRoute()}


def body(api: str, *, stream: bool, max_tokens: int = 20, **extra: Any) -> dict[str, Any]:
    if api == "responses":
        return {"model": "m1", "input": PROMPT, "max_output_tokens": max_tokens, "stream": stream, **extra}
    if api == "messages":
        return {"model": "m1", "max_tokens": max_tokens, "stream": stream,
                "messages": [{"role": "user", "content": PROMPT}], **extra}
    return {"model": "m1", "input": [PROMPT, PROMPT], **extra}


def path(api: str) -> str:
    return f"/v1/{api}"


def estimate(api: str, b: dict[str, Any]) -> int:
    """The request's prompt estimate (`typical`): what an unknown prompt is charged."""
    shape = ROUTES[api].reserve_shape(ROUTES[api].parse(orjson.dumps(b), {}))
    return estimate_body(shape.body, prompts_field=shape.prompts_field).typical


def unreported_prompt(api: str, b: dict[str, Any]) -> int:
    """The prompt a stream that ended early is charged: Messages has it from `message_start`, Responses not."""
    return 5 if api == "messages" else estimate(api, b)


async def start(start_gateway: Start, **engine: Any) -> tuple[FakeEngine, RunningGateway]:
    eng = await FakeEngine(FakeEngineConfig(model="m1", **engine)).start()
    gw = await start_gateway(settings(eng.url, tenants=TENANTS, inter_chunk_timeout_s=0.5, first_byte_timeout_s=5))
    return eng, gw


async def check(gw: RunningGateway, expected: Usage, *, requests: int = 1) -> dict[str, int]:
    totals, counter = await charged(gw)
    assert (totals["prompt_tokens"], totals["completion_tokens"]) == (expected.prompt_tokens,
                                                                     expected.completion_tokens)
    assert totals["cost_micros"] == cost_micros(expected, RATES) == counter  # nothing leaked or lost
    assert totals["requests"] == requests and in_flight(gw) == 0
    return totals


async def events(gw: RunningGateway, api: str, b: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    name = ""
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c, c.stream(
        "POST", path(api), json=b, headers=auth("acme")
    ) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, orjson.loads(line[6:])))
    return out


def api_error(api: str, event: dict[str, Any]) -> str:
    """The code (Responses) or type (Messages) of an error event in the API's own shape."""
    assert event["type"] == "error"
    return str(event["code"] if api == "responses" else event["error"]["type"])


STREAMED = ["responses", "messages"]


# ---- clients that leave ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("api", STREAMED)
async def test_a_client_leaving_mid_stream_is_charged_what_the_engine_generated(api: str, start_gateway: Start) -> None:
    engine, gw = await start(start_gateway, hang_after_chunks=4)
    b = body(api, stream=True)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c, c.stream(
        "POST", path(api), json=b, headers=auth("acme")
    ) as r:
        async for line in r.aiter_lines():
            if '"t3 "' in line:
                break  # leave with the fourth token: the connection is closed
    assert await eventually(lambda: engine.stats.cancelled == 1)  # the engine was aborted
    assert engine.stats.completion_tokens == 4
    totals = await check(gw, Usage(prompt_tokens=unreported_prompt(api, b), completion_tokens=4))
    assert totals["errors"] == 1  # a 499


@pytest.mark.parametrize("api", STREAMED)
async def test_a_client_leaving_a_non_streaming_wait_is_charged_what_the_engine_generated(
    api: str, start_gateway: Start
) -> None:
    """Non-streaming requests are streamed from the engine and collected, so the output so far is known."""
    engine, gw = await start(start_gateway, hang_after_chunks=5)
    b = body(api, stream=False)
    async with httpx.AsyncClient(base_url=gw.url) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post(path(api), json=b, headers=auth("acme"), timeout=0.5)
    assert await eventually(lambda: engine.stats.cancelled == 1)
    assert engine.received[-1].body["stream"] is True
    await check(gw, Usage(prompt_tokens=unreported_prompt(api, b), completion_tokens=5))


@pytest.mark.parametrize("api", [*STREAMED, "embeddings"])
async def test_a_client_leaving_before_the_headers_is_charged_the_prompt_estimate(
    api: str, start_gateway: Start
) -> None:
    engine, gw = await start(start_gateway, prefill_delay_s=30)
    b = body(api, stream=False)
    async with httpx.AsyncClient(base_url=gw.url) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post(path(api), json=b, headers=auth("acme"), timeout=0.5)
    assert await eventually(lambda: engine.stats.cancelled == 1)
    # The engine had the prompt (its prefill was under way) and reported nothing: the estimate, never $0.
    typical = estimate(api, b) if api != "embeddings" else 2 * (len(PROMPT) // 4 + 2)
    await check(gw, Usage(prompt_tokens=typical))


# ---- engines that fail -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("api", STREAMED)
async def test_an_engine_dying_mid_stream_ends_it_with_the_apis_error_and_is_charged_what_it_did(
    api: str, start_gateway: Start
) -> None:
    engine, gw = await start(start_gateway, drop_after_chunks=3)
    b = body(api, stream=True)
    got = await events(gw, api, b)
    name, last = got[-1]
    assert name == "error" and api_error(api, last) in ("upstream_error", "api_error")
    assert sum(1 for n, _ in got if n.endswith("delta")) == engine.stats.completion_tokens == 3
    await check(gw, Usage(prompt_tokens=unreported_prompt(api, b), completion_tokens=engine.stats.completion_tokens))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post(path(api), json=body(api, stream=False), headers=auth("acme"))
    assert r.status_code == 502 and engine.stats.completion_tokens == 6
    await check(gw, Usage(prompt_tokens=2 * unreported_prompt(api, b), completion_tokens=6), requests=2)


@pytest.mark.parametrize("api", STREAMED)
async def test_a_silent_engine_is_cut_off_and_charged_what_it_generated(api: str, start_gateway: Start) -> None:
    engine, gw = await start(start_gateway, hang_after_chunks=2)
    b = body(api, stream=True)
    name, last = (await events(gw, api, b))[-1]
    assert name == "error" and api_error(api, last) in ("upstream_timeout", "timeout_error")
    assert await eventually(lambda: engine.stats.cancelled == 1)  # the gateway hung up on it
    assert engine.stats.completion_tokens == 2
    await check(gw, Usage(prompt_tokens=unreported_prompt(api, b), completion_tokens=engine.stats.completion_tokens))


@pytest.mark.parametrize("api", [*STREAMED, "embeddings"])
@pytest.mark.parametrize("stream", [False, True])
async def test_an_engine_refusal_costs_nothing_and_is_answered_in_the_apis_shape(
    api: str, stream: bool, start_gateway: Start
) -> None:
    if api == "embeddings" and stream:
        return  # embeddings are not streamed
    engine, gw = await start(start_gateway, fail_status=500, fail_message="Traceback (most recent call last): boom")
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post(path(api), json=body(api, stream=stream), headers=auth("acme"))
    assert r.status_code == 500 and "Traceback" not in r.text
    assert (r.json()["error"]["type"] == "api_error") if api == "messages" else ("code" in r.json()["error"])
    assert engine.stats.requests == 1 and engine.stats.prompt_tokens == 0  # refused: it read nothing
    await check(gw, Usage())


@pytest.mark.parametrize("api", [*STREAMED, "embeddings"])
async def test_malformed_usage_is_charged_by_estimate_and_counted(api: str, start_gateway: Start) -> None:
    engine, gw = await start(start_gateway, usage_override="12")
    b = body(api, stream=False, max_tokens=3)
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post(path(api), json=b, headers=auth("acme"))
        assert r.status_code == 200
        metrics = (await c.get(gw.metrics_url)).text
    assert 'kind="bad_usage"' in metrics
    typical = estimate(api, b) if api != "embeddings" else 2 * (len(PROMPT) // 4 + 2)
    # Messages: the prompt message_start reported (what the engine read); the output it was seen to generate.
    prompt = engine.stats.prompt_tokens if api == "messages" else typical
    await check(gw, Usage(prompt_tokens=prompt, completion_tokens=engine.stats.completion_tokens))


@pytest.mark.parametrize("api", STREAMED)
@pytest.mark.parametrize("stream", [True, False])
async def test_an_engine_streaming_past_the_output_limit_is_cut_off_and_never_charged_past_it(
    api: str, stream: bool, start_gateway: Start
) -> None:
    engine, gw = await start(start_gateway, runaway_tokens=500, inter_token_delay_s=0.002)
    b = body(api, stream=stream, max_tokens=5)
    if stream:
        name, last = (await events(gw, api, b))[-1]
        assert name == "error" and last["type"] == "error"
    else:
        r = await httpx.AsyncClient(base_url=gw.url).post(path(api), json=b, headers=auth("acme"))
        assert r.status_code == 502
    assert await eventually(lambda: engine.stats.running == 0)
    assert engine.stats.completion_tokens < 100  # aborted at the cut-off (2 x 5 + 16 deltas), not at 500
    await check(gw, Usage(prompt_tokens=unreported_prompt(api, b), completion_tokens=5))


async def test_many_disconnects_at_random_stages_on_every_route_lose_no_spend(start_gateway: Start) -> None:
    engine, gw = await start(start_gateway, inter_token_delay_s=0.01, prefill_delay_s=0.02)
    async with httpx.AsyncClient(base_url=gw.url) as c:  # warm: a cold first request can take past every timeout
        for api in STREAMED:
            warm = await c.post(path(api), json=body(api, stream=False, max_tokens=2), headers=auth("acme"))
            assert warm.status_code == 200

    async def one(i: int) -> None:
        api = STREAMED[i % 2]
        b = body(api, stream=bool(i % 3), max_tokens=30)  # 320 ms at the engine; every client leaves before
        async with httpx.AsyncClient(base_url=gw.url) as c:
            with contextlib.suppress(httpx.TimeoutException):
                await c.post(path(api), json=b, headers=auth("acme"), timeout=0.02 + 0.05 * (i % 5))

    await asyncio.gather(*(one(i) for i in range(24)))
    assert await eventually(lambda: engine.stats.running == 0, timeout_s=10)
    await gw.pipeline.drain()  # every settle and record has run
    totals, counter = await charged(gw)
    # A client whose 20 ms ran out before the gateway read its request (a loaded machine) never made one: every
    # request the engine saw is recorded, and none twice.
    assert engine.stats.cancelled > 0 and engine.stats.requests <= totals["requests"] <= 26
    # Each request is charged the output that reached the gateway: a token the engine writes after the gateway
    # hung up (before it sees the abort) is not; at most one per aborted request here (10 ms per token).
    missing = engine.stats.completion_tokens - totals["completion_tokens"]
    assert 0 <= missing <= engine.stats.cancelled
    assert totals["cost_micros"] == counter and in_flight(gw) == 0


# ---- abuse -------------------------------------------------------------------------------------------------

def _nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"a": [value]}
    return value


ODD = "\U0001f9ea\u202e\ufdfa\u0000"
HOSTILE: list[tuple[str, dict[str, Any]]] = [
    ("responses", {"input": [{"type": "computer_call", "action": {"x": 1}}]}),  # a kind vLLM cannot render
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": ODD * 2000}]}]}),
    ("responses", {"input": [{"role": "user", "content": "x", "extra": _nested(100)}]}),
    ("responses", {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{{ not json"},
                             {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text",
                                                                                          "text": "y" * 3000}]}]}),
    ("responses", {"input": [{"role": "user", "content": "z"}] * 3000}),
    ("responses", {"input": [{"role": "user", "content": "z"}] * 20_000}),  # over MAX_ITEMS: a 400
    ("responses", {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": _nested(110)}] * 3}),
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,A" * 900}]}]}),
    ("responses", {"input": "hi", "previous_response_id": "resp_" + "9" * 150}),  # unknown: a 404
    ("responses", {"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": ODD * 500}]},
                             {"role": "user", "content": "go"}]}),
    ("messages", {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}),
    ("messages", {"messages": [{"role": "user", "content": [{"type": "text", "text": ODD * 2000}]}]}),
    ("messages", {"messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "c", "name": "f", "input": _nested(110)}]}, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c", "content": [{"type": "text", "text": "r" * 3000}]}]}]}),
    ("messages", {"system": [{"type": "text", "text": ODD * 1000}], "messages": [{"role": "user", "content": "x"}]}),
    ("messages", {"messages": [{"role": "user", "content": "z"}, {"role": "assistant", "content": "y"}] * 1500}),
    ("embeddings", {"input": list(range(50_000))}),
    ("embeddings", {"input": [ODD * 300] * 2048}),
    ("embeddings", {"input": [[1, 2], "mixed"]}),
]


def hostile_body(api: str, extra: dict[str, Any]) -> dict[str, Any]:
    limit = {"responses": {"max_output_tokens": 5}, "messages": {"max_tokens": 5}}.get(api, {})
    return {"model": "m1", **limit, **extra}


async def test_hostile_input_items_get_no_5xx_and_are_charged_what_the_engine_read_within_the_budget(
    redis_url: str, start_engine: Start, start_gateway: Start
) -> None:
    """Input items and blocks the validator and the bound walk (kinds no engine renders, deep nesting, escapes,
    thousands of items, media, invalid tool-call JSON, 50,000 token ids): a clean answer in the API's own shape,
    never a 5xx or a traceback; charged exactly what the bytes-counting engine read, never past the budget."""
    engine = await start_engine(model="m1", prompt_count="bytes")
    tenants = [{"id": "acme", "key_hashes": [KEYS["acme"][1]], "daily_budget_usd": "0.06"}]  # 60,000 µ$
    gw = await start_gateway(settings(engine.url, redis_url=redis_url, tenants=tenants))
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
        for api, extra in HOSTILE * 2:
            r = await c.post(path(api), json=hostile_body(api, extra), headers=auth("acme"))
            statuses.append(r.status_code)
            assert r.status_code < 500 and "Traceback" not in r.text and r.headers.get("x-request-id"), r.text[:300]
            assert ("type" in r.json() and r.json()["type"] in ("message", "error")) if api == "messages" \
                else ("error" in r.json() or r.status_code == 200)
    assert await eventually(lambda: engine.stats.running == 0)
    totals, counter = await charged(gw)
    processed = cost_micros(Usage(prompt_tokens=engine.stats.prompt_tokens,
                                  completion_tokens=engine.stats.completion_tokens), RATES)
    assert {200, 400, 404, 429} <= set(statuses), statuses
    assert totals["cost_micros"] == processed == counter <= 60_000


async def test_a_budget_raced_from_three_replicas_on_every_route_is_never_overspent(
    redis_url: str, start_engine: Start, start_gateway: Start
) -> None:
    engine = await start_engine(model="m1", prompt_count="bytes", prefill_delay_s=0.01)
    budget = 20_000  # µ$; each request costs about 1,000-2,500
    tenants = [{"id": "acme", "key_hashes": [KEYS["acme"][1]], "daily_budget_usd": str(budget / 1e6)}]
    config = settings(engine.url, redis_url=redis_url, tenants=tenants)
    gws = [await start_gateway(config) for _ in range(3)]
    text = "w" * 999 + " "
    bodies = [("responses", {"model": "m1", "input": text, "max_output_tokens": 20}),
              ("responses", {"model": "m1", "input": text, "max_output_tokens": 20, "stream": True}),
              ("messages", {"model": "m1", "max_tokens": 20, "messages": [{"role": "user", "content": text}]}),
              ("messages", {"model": "m1", "max_tokens": 20, "stream": True,
                            "messages": [{"role": "user", "content": text}]}),
              ("embeddings", {"model": "m1", "input": [text, text]})]
    codes: list[int] = []

    async def client(i: int) -> None:
        async with httpx.AsyncClient(base_url=gws[i % 3].url, timeout=30) as c:
            for k in range(8):
                api, b = bodies[(i + k) % len(bodies)]
                r = await c.post(path(api), json=b, headers=auth("acme"))
                codes.append(r.status_code)

    await asyncio.gather(*(client(i) for i in range(9)))
    assert await eventually(lambda: engine.stats.running == 0)
    for gw in gws:
        await gw.pipeline.drain()
    totals, counter = await charged(gws[1])
    processed = cost_micros(Usage(prompt_tokens=engine.stats.prompt_tokens,
                                  completion_tokens=engine.stats.completion_tokens), RATES)
    assert set(codes) == {200, 429}, codes
    assert totals["cost_micros"] == processed == counter
    assert budget * 0.5 <= processed <= budget  # spent, and never past it
