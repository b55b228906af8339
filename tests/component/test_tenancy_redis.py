"""Proof with a real Redis: several gateway apps share one Redis.

- Totals equal the sum of the usage the engine itself reported, exactly, for non-streamed, streamed
  (with and without client-requested usage) and client-cancelled streams, per tenant, in tokens and in
  integer micro-dollars.
- Concurrent requests over the replicas never exceed a daily budget when estimates are upper bounds, and
  exceed it by at most the overrun of the requests in flight when the engine generates more than the
  reservation assumed; the budget counter equals the ledger once everything settled (nothing leaks).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from fleetgate.core.types import Usage
from fleetgate.gateway.settings import ModelRoute
from fleetgate.gateway.tenancy.config import ListPrice
from fleetgate.gateway.tenancy.pricing import cost_micros, list_rates
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

from .conftest import RunningGateway, eventually
from .test_tenancy_gateway import KEYS, PRICE, auth, settings

pytestmark = pytest.mark.redis
RATES = list_rates(ListPrice.model_validate(PRICE))  # 1 µ$ per prompt token, 2 µ$ per completion token


class RecordingEngine(FakeEngine):
    """The fake engine, plus the last usage it actually sent on each response (body or stream chunk)."""

    def __init__(self, config: FakeEngineConfig) -> None:
        super().__init__(config)
        self.reported: list[dict[str, Any] | None] = []

    def app(self) -> web.Application:
        app = super().app()
        app.on_response_prepare.append(self._prepared)
        return app

    async def _prepared(self, request: web.Request, response: web.StreamResponse) -> None:
        if not request.path.endswith("completions"):
            return
        slot = len(self.reported)
        self.reported.append(None)
        if isinstance(response, web.Response):
            if isinstance(response.body, bytes) and response.status == 200:
                self.reported[slot] = orjson.loads(response.body).get("usage")
            return
        write = response.write

        async def recording_write(data: bytes) -> None:
            # Counted once it was handed to the connection: also when the handler is cancelled while the
            # write waits (the engine aborting as the gateway hangs up), not when the connection was closed.
            try:
                await write(data)
            except (ConnectionError, RuntimeError):
                raise
            except BaseException:
                self._record(slot, data)
                raise
            self._record(slot, data)

        response.write = recording_write  # type: ignore[method-assign]

    def _record(self, slot: int, data: bytes) -> None:
        for line in bytes(data).split(b"\n"):
            if line.startswith(b"data: {"):
                usage = orjson.loads(line[6:]).get("usage")
                if usage:
                    self.reported[slot] = usage

    def usages(self) -> list[Usage]:
        return [Usage.from_openai(u) for u in self.reported if u]


def chat(words: int, *, max_tokens: int | None, stream: bool = False, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m1", "stream": stream, **extra,
                            "messages": [{"role": "user", "content": " ".join(["w"] * words)}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


async def gateways(n: int, start_gateway: Callable[..., Awaitable[RunningGateway]], **kw: Any) -> list[RunningGateway]:
    return [await start_gateway(settings(**kw)) for _ in range(n)]


async def settle_all(gws: list[RunningGateway], engine: FakeEngine) -> None:
    assert await eventually(lambda: engine.stats.running == 0, timeout_s=10)
    for gw in gws:
        await gw.pipeline.drain()


async def test_totals_equal_engine_usage_streamed_plain_and_cancelled(
    redis_url: str, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    engine = await RecordingEngine(FakeEngineConfig(model="m1", inter_token_delay_s=0.01)).start()
    # Cancelled streams go to model m2, whose engine goes silent after two tokens: the client leaves
    # once it has read the second one, so what the engine sent before the cut is exact, not a race
    # between the engine's next token and the gateway closing the connection.
    stalling = await RecordingEngine(FakeEngineConfig(model="m2", hang_after_chunks=2)).start()
    try:
        config = settings(engine.url, redis_url=redis_url,
                          tenants=[{"id": t, "key_hashes": [KEYS[t][1]]} for t in ("acme", "globex")])
        config.models[1] = ModelRoute(name="m2", endpoints=[stalling.url])
        gws = [await start_gateway(config) for _ in range(3)]
        # acme's prompts have 5 words, globex's 8: the engine's usage says whose request it was.
        words = {"acme": 5, "globex": 8}
        rng = random.Random(11)
        jobs = [(gws[i % 3], ["acme", "globex"][i % 2], ["plain", "stream", "stream_usage", "cancel"][i % 4],
                 rng.randint(3, 12)) for i in range(24)]

        async def run(gw: RunningGateway, tenant: str, kind: str, n: int) -> None:
            async with httpx.AsyncClient(base_url=gw.url, timeout=20) as c:
                if kind == "plain":
                    r = await c.post("/v1/chat/completions", json=chat(words[tenant], max_tokens=n),
                                     headers=auth(tenant))
                    assert r.status_code == 200
                    return
                extra = {"stream_options": {"include_usage": True}} if kind == "stream_usage" else {}
                body = chat(words[tenant], max_tokens=n, stream=True, **extra)
                if kind == "cancel":
                    body["model"] = "m2"
                async with c.stream("POST", "/v1/chat/completions", json=body, headers=auth(tenant)) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if kind == "cancel" and '"t1 "' in line:
                            break  # leave mid-stream: the connection is closed

        await asyncio.gather(*(run(*job) for job in jobs))
        await settle_all(gws, engine)
        assert await eventually(lambda: stalling.stats.cancelled == 6, timeout_s=10)  # cut off at the engine
        for gw in gws:
            await gw.pipeline.drain()

        async with httpx.AsyncClient(base_url=gws[1].url) as c:
            report = (await c.get("/v1/usage", headers=auth("admin"))).json()
        by_tenant = {g["tenant"]: g for g in report["by_tenant"]}
        reported = engine.usages() + stalling.usages()
        for tenant, w in words.items():
            mine = [u for u in reported if u.prompt_tokens == w]
            assert by_tenant[tenant]["requests"] == 12
            assert by_tenant[tenant]["prompt_tokens"] == sum(u.prompt_tokens for u in mine)
            assert by_tenant[tenant]["completion_tokens"] == sum(u.completion_tokens for u in mine)
            assert by_tenant[tenant]["cost_micros"] == sum(cost_micros(u, RATES) for u in mine)
        # Cancelled streams were charged the two tokens the engine produced, not what they asked for.
        assert [u.completion_tokens for u in stalling.usages()] == [2] * 6
    finally:
        await engine.stop()
        await stalling.stop()


async def _spend_race(
    redis_url: str, start_gateway: Callable[..., Awaitable[RunningGateway]], *, engine: FakeEngine,
    body: dict[str, Any], budget_micros: int, requests: int, concurrency: int, **server: Any,
) -> tuple[int, int, int, dict[str, Any]]:
    tenants = [{"id": "acme", "key_hashes": [KEYS["acme"][1]], "daily_budget_usd": str(budget_micros / 1e6)}]
    gws = await gateways(3, start_gateway, engine_url=engine.url, redis_url=redis_url, tenants=tenants, **server)
    queue = list(range(requests))
    codes: list[int] = []

    async def client(i: int) -> None:
        async with httpx.AsyncClient(base_url=gws[i % 3].url, timeout=20) as c:
            while queue:
                queue.pop()
                r = await c.post("/v1/chat/completions", json=body, headers=auth("acme"))
                codes.append(r.status_code)
                if r.status_code == 429:
                    assert r.json()["error"]["code"] == "insufficient_quota"

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    await settle_all(gws, engine)
    async with httpx.AsyncClient(base_url=gws[2].url) as c:
        report = (await c.get("/v1/usage", headers=auth("admin"))).json()
        budgets = (await c.get("/v1/usage/budgets", headers=auth("acme"))).json()
    spent = report["totals"]["cost_micros"]
    assert set(codes) <= {200, 429} and len(codes) == requests
    assert report["totals"]["requests"] == requests and report["totals"]["errors"] == codes.count(429)
    assert budgets["data"][0]["windows"]["daily_budget"]["used"] == spent  # no reservation leaked
    return spent, codes.count(200), codes.count(429), report


async def test_budget_is_never_exceeded_when_estimates_are_upper_bounds(
    redis_url: str, start_gateway: Callable[..., Awaitable[RunningGateway]], start_engine: Any
) -> None:
    engine = await start_engine(model="m1", prefill_delay_s=0.01)
    # Long words: the gateway's prompt estimate (4 characters per token) is above the engine's count
    # (one token per word), and max_tokens bounds the completion: every estimate >= the real cost.
    body = {"model": "m1", "max_tokens": 20, "messages": [{"role": "user", "content": " ".join(["abcdefghij"] * 10)}]}
    real = cost_micros(Usage(prompt_tokens=10, completion_tokens=20), RATES)  # 50 µ$
    spent, ok, refused, _ = await _spend_race(redis_url, start_gateway, engine=engine, body=body,
                                              budget_micros=1000, requests=80, concurrency=12)
    assert refused > 0 and spent == ok * real
    assert spent <= 1000  # never over, with 12 clients on 3 replicas racing for the last dollars


async def test_without_max_tokens_the_gateway_bounds_the_completion_upstream(
    redis_url: str, start_gateway: Callable[..., Awaitable[RunningGateway]], start_engine: Any
) -> None:
    # No max_tokens: the gateway reserves server.default_max_tokens=4 completion tokens and sets that
    # upstream (lower near the end of the budget), so an engine that would generate 30 generates at most
    # what was reserved and the budget holds across 3 replicas (it was overrun by 70 µ$ per request in
    # flight before).
    engine = await start_engine(model="m1", prefill_delay_s=0.01, default_max_tokens=30)
    body = {"model": "m1", "messages": [{"role": "user", "content": " ".join(["w"] * 10)}]}
    spent, ok, refused, _ = await _spend_race(redis_url, start_gateway, engine=engine, body=body,
                                              budget_micros=1000, requests=80, concurrency=8,
                                              default_max_tokens=4)
    caps = [r.body.get("max_tokens") for r in engine.received]
    assert refused > 0 and ok == len(caps)
    assert all(isinstance(c, int) and 1 <= c <= 4 for c in caps)
    assert spent == sum(cost_micros(Usage(prompt_tokens=10, completion_tokens=c), RATES) for c in caps)
    assert spent <= 1000
