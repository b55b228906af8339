"""Budgets that hold whatever the prompt contains (issue 26, defects 1-2), through real gateways on a real
`redis-server`, in front of a fake engine that reads every content kind and counts one token per UTF-8 byte
(the most any real tokenizer makes of a text; media items at a fixed 64 tokens each).

For every content kind a hostile tenant sends requests that each cost about 40% of its daily budget, until
refused. Every case asserts: the tenant is never charged beyond its budget (each reservation is at least what
the engine charges); the ledger charges exactly what the engine processed; the budget counter equals the
ledger; the bound alone never refuses what fits (the exact count from the engine's `/tokenize` is asked
then, so two requests are served); no 5xx.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest

from fleetgate.core.types import Usage
from fleetgate.gateway.tenancy.config import ListPrice
from fleetgate.gateway.tenancy.pricing import cost_micros, list_rates
from fleetgate.sim.fake_engine import MEDIA_TOKENS, FakeEngine

from .conftest import RunningGateway
from .test_tenancy_gateway import KEYS, PRICE, auth, settings

pytestmark = pytest.mark.redis
RATES = list_rates(ListPrice.model_validate(PRICE))  # 1 µ$ a prompt token, 2 a completion token
BUDGET = 10_000  # µ$
PER_REQUEST = 4_000  # prompt tokens (µ$) each hostile request makes the engine read
MAX_TOKENS = 5

ODD = "\U0001f9ea"  # 4 bytes: 4 tokens for the engine, 1 character (the old estimate: 1/4 token)


def _words(n_bytes: int) -> str:
    return "w" * (n_bytes - 1) + " "


def _image() -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 5_000}}


def _tool(n: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "description": _words(n)}}


def _call(n: int) -> dict[str, Any]:
    arguments = orjson.dumps({"q": "x" * n}).decode()
    return {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}


AUDIO = {"type": "input_audio", "input_audio": {"data": "B" * 9000, "format": "wav"}}
# kind -> (path, body); each body makes the engine read about PER_REQUEST tokens
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "text": ("chat", {"messages": [{"role": "user", "content": _words(PER_REQUEST)}]}),
    "thinking part": ("chat", {"messages": [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": _words(PER_REQUEST)}]}, {"role": "user", "content": "go"}]}),
    "refusal part": ("chat", {"messages": [{"role": "assistant", "content": [
        {"type": "refusal", "refusal": _words(PER_REQUEST)}]}, {"role": "user", "content": "why"}]}),
    "odd unicode": ("chat", {"messages": [{"role": "user", "content": ODD * (PER_REQUEST // 4)}]}),
    "image_url": ("chat", {"messages": [{"role": "user", "content": [_image()] * (PER_REQUEST // MEDIA_TOKENS)}]}),
    "input_audio": ("chat", {"messages": [{"role": "user", "content": [AUDIO] * (PER_REQUEST // MEDIA_TOKENS)}]}),
    "tools": ("chat", {"tools": [_tool(PER_REQUEST // 4)] * 4, "messages": [{"role": "user", "content": "hi"}]}),
    "assistant tool_calls": ("chat", {"messages": [{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": None, "tool_calls": [_call(PER_REQUEST // 4 - 10)] * 4}]}),
    "tool message": ("chat", {"messages": [{"role": "user", "content": "hi"}, {
        "role": "tool", "tool_call_id": "c1", "content": _words(PER_REQUEST)}]}),
    "name field": ("chat", {"messages": [{"role": "user", "content": "hi", "name": "n" * PER_REQUEST}]}),
    "prompt list": ("completions", {"prompt": [_words(PER_REQUEST // 4)] * 4}),
}


async def spend(gw: RunningGateway, engine: FakeEngine) -> tuple[dict[str, Any], float]:
    assert await _idle(engine)
    await gw.pipeline.drain()
    async with httpx.AsyncClient(base_url=gw.url) as c:
        totals = (await c.get("/v1/usage", headers=auth("admin"))).json()["totals"]
        budgets = (await c.get("/v1/usage/budgets", headers=auth("acme"))).json()
    return totals, budgets["data"][0]["windows"]["daily_budget"]["used"]


async def _idle(engine: FakeEngine) -> bool:
    for _ in range(250):
        if engine.stats.running == 0:
            return True
        await asyncio.sleep(0.02)
    return False


def tenant_settings(engine: FakeEngine, redis_url: str) -> Any:
    return settings(engine.url, redis_url=redis_url, tenants=[
        {"id": "acme", "key_hashes": [KEYS["acme"][1]], "daily_budget_usd": str(BUDGET / 1e6)}])


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_hostile_tenant_cannot_spend_past_its_budget_with_any_content_kind(
    kind: str, redis_url: str, start_engine: Callable[..., Awaitable[FakeEngine]],
    start_gateway: Callable[..., Awaitable[RunningGateway]],
) -> None:
    engine = await start_engine(model="m1", prompt_count="bytes")
    gw = await start_gateway(tenant_settings(engine, redis_url))
    path, body = KINDS[kind]
    codes: list[int] = []
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        for _ in range(4):
            r = await c.post(f"/v1/{'chat/' if path == 'chat' else ''}completions", headers=auth("acme"),
                             json={"model": "m1", "max_tokens": MAX_TOKENS, **body})
            codes.append(r.status_code)
    totals, counter = await spend(gw, engine)
    processed = cost_micros(Usage(prompt_tokens=engine.stats.prompt_tokens,
                                  completion_tokens=engine.stats.completion_tokens), RATES)
    assert codes[:2] == [200, 200] and codes[2:] == [429, 429], codes  # ~40% each: two fit, the third does not
    assert 0.7 * PER_REQUEST <= engine.stats.prompt_tokens / 2 <= 1.3 * PER_REQUEST  # the body is as sized
    assert totals["cost_micros"] == processed <= BUDGET  # charged what the engine did, never past the budget
    assert counter == totals["cost_micros"]
    assert engine.stats.tokenized >= 1  # the bound was refused once at least: the exact count decided


async def test_three_replicas_racing_with_thinking_parts_stay_within_the_budget(
    redis_url: str, start_engine: Callable[..., Awaitable[FakeEngine]],
    start_gateway: Callable[..., Awaitable[RunningGateway]],
) -> None:
    """The issue's race: 3 replicas spent 3.95x a $0.01 budget with `thinking` parts the estimate ignored."""
    engine = await start_engine(model="m1", prompt_count="bytes", prefill_delay_s=0.01)
    config = tenant_settings(engine, redis_url)
    gws = [await start_gateway(config) for _ in range(3)]
    _, body = KINDS["thinking part"]
    small = {"model": "m1", "max_tokens": MAX_TOKENS, "messages": [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": _words(900)}]}, {"role": "user", "content": "go"}]}
    codes: list[int] = []

    async def client(i: int) -> None:
        async with httpx.AsyncClient(base_url=gws[i % 3].url, timeout=30) as c:
            for k in range(6):
                b = small if k % 2 else {"model": "m1", "max_tokens": MAX_TOKENS, **body}
                codes.append((await c.post("/v1/chat/completions", json=b, headers=auth("acme"))).status_code)

    await asyncio.gather(*(client(i) for i in range(9)))
    for gw in gws:
        await gw.pipeline.drain()
    totals, counter = await spend(gws[0], engine)
    processed = cost_micros(Usage(prompt_tokens=engine.stats.prompt_tokens,
                                  completion_tokens=engine.stats.completion_tokens), RATES)
    assert set(codes) == {200, 429}
    assert totals["cost_micros"] == processed == counter
    assert BUDGET * 0.5 <= processed <= BUDGET  # spent, and never past it (was 3.95x)


def _nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"a": [value]}
    return value


HOSTILE: list[tuple[str, bytes]] = [
    ("chat", orjson.dumps({"tools": [{"type": "function", "function": {"name": "f", "parameters": _nested(120)}}],
                           "messages": [{"role": "user", "content": "x"}]})),
    ("chat", orjson.dumps({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{{{ not json"}},
        {"id": "2", "type": "function", "function": {"name": "f", "arguments": orjson.dumps(_nested(120)).decode()}},
        {"id": "3", "type": "function", "function": {"name": 7, "arguments": 12}}]},
        {"role": "user", "content": "y"}]})),
    ("chat", orjson.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": 5}, {"type": "input_audio"}, {"type": "video_url", "video_url": [1]},
        {"type": "thinking"}, {"type": "refusal", "refusal": None}, {"type": "x" * 5000, "y": _nested(50)}]}]})),
    ("chat", orjson.dumps({"messages": [{"role": "user", "content": "\u0000\u202e\ufdfa\U0010ffff" * 500}],
                           "chat_template_kwargs": {"k" * 1000: [1e308, -0.0, 2**63 - 1, None, True]}})),
    ("chat", b'{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"' + b"\\ud83e\\uddea" * 3000
     + b'"}],"big":123456789012345678901234567890}'),
    ("chat", orjson.dumps({"messages": [{"role": "user", "content": "z"}] * 5000})),
    ("chat", b'{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"\\ud800"}]}'),
    ("completions", orjson.dumps({"prompt": list(range(100_000))})),
    ("completions", orjson.dumps({"prompt": [[1, 2], "mixed"]})),
    ("completions", orjson.dumps({"prompt": ["p"] * 2000, "n": 3})),
]


async def test_hostile_content_shapes_get_no_5xx_and_never_overspend(
    redis_url: str, start_engine: Callable[..., Awaitable[FakeEngine]],
    start_gateway: Callable[..., Awaitable[RunningGateway]],
) -> None:
    """Malformed and extreme content the estimator walks (deep tool schemas, arguments that are not JSON,
    media parts of the wrong shape, escapes, 5,000 messages, 100,000 token ids): a clean answer, never a 5xx
    or a traceback, and the budget still holds with the counter equal to the ledger."""
    engine = await start_engine(model="m1", prompt_count="bytes")
    gw = await start_gateway(tenant_settings(engine, redis_url))
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
        for kind, raw in HOSTILE * 2:
            if raw.startswith(b'{"model"'):
                body = raw
            else:
                body = orjson.dumps({"model": "m1", "max_tokens": MAX_TOKENS, **orjson.loads(raw)})
            path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
            r = await c.post(path, content=body, headers={**auth("acme"), "content-type": "application/json"})
            statuses.append(r.status_code)
            assert r.status_code < 500 and "Traceback" not in r.text and r.headers.get("x-request-id"), r.text[:300]
    totals, counter = await spend(gw, engine)
    processed = cost_micros(Usage(prompt_tokens=engine.stats.prompt_tokens,
                                  completion_tokens=engine.stats.completion_tokens), RATES)
    assert {200, 400, 429} <= set(statuses), statuses
    assert totals["cost_micros"] == processed == counter <= BUDGET
