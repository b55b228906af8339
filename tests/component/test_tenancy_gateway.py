"""Tenancy through a real gateway (uvicorn) in front of a fake engine: 401/403/429 in OpenAI shape, the
usage API's scopes and formats, metrics, and accounting equal to the engine's own usage."""

from __future__ import annotations

import csv
import io
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from fleetgate.core.types import Usage
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.tenancy.config import ListPrice
from fleetgate.gateway.tenancy.keys import new_key
from fleetgate.gateway.tenancy.pricing import cost_micros, list_rates
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway

KEYS = {name: new_key() for name in ("acme", "globex", "admin")}
PRICE = {"input_usd_per_1m": "1", "output_usd_per_1m": "2"}


def settings(engine_url: str, *, tenants: list[dict[str, Any]] | None = None, redis_url: str | None = None,
             **server: Any) -> GatewaySettings:
    default_tenants = [
        {"id": "acme", "name": "Acme", "key_hashes": [KEYS["acme"][1]], "models": ["m1"], "rpm": 1000,
         "daily_budget_usd": "10"},
        {"id": "globex", "key_hashes": [KEYS["globex"][1]]},
    ]
    return GatewaySettings.model_validate({
        "server": {"auth": "api_key", **server},
        "models": [{"name": "m1", "endpoints": [engine_url]}, {"name": "m2", "endpoints": [engine_url]}],
        "redis_url": redis_url,
        "tenancy": {
            "admin_key_hashes": [KEYS["admin"][1]],
            "tenants": tenants if tenants is not None else default_tenants,
            "prices": {"m1": PRICE, "m2": PRICE},
        },
    })


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name][0]}"}


def chat(model: str = "m1", *, words: int = 3, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    content = " ".join(f"w{i}" for i in range(words))
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **extra}


async def drain(gw: RunningGateway) -> None:
    await gw.pipeline.drain()


@pytest.fixture
async def gw(engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]) -> RunningGateway:
    return await start_gateway(settings(engine.url))


async def test_missing_or_wrong_key_is_401_and_foreign_model_403(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post("/v1/chat/completions", json=chat())
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = await c.post("/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer fg-wrong"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = await c.post("/v1/chat/completions", json=chat("m2"), headers=auth("acme"))
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        assert "m2" in r.json()["error"]["message"]
        assert (await c.post("/v1/chat/completions", json=chat("m1"), headers=auth("acme"))).status_code == 200
        assert (await c.post("/v1/chat/completions", json=chat("m2"), headers=auth("globex"))).status_code == 200
        r = await c.post("/v1/chat/completions", json=chat(), headers=auth("admin"))
        assert r.status_code == 403


async def test_rpm_limit_is_429_with_retry_after(engine: FakeEngine, start_gateway: Any) -> None:
    gw = await start_gateway(settings(engine.url, tenants=[{"id": "acme", "key_hashes": [KEYS["acme"][1]],
                                                            "rpm": 2}]))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        for _ in range(2):
            assert (await c.post("/v1/chat/completions", json=chat(), headers=auth("acme"))).status_code == 200
        r = await c.post("/v1/chat/completions", json=chat(), headers=auth("acme"))
    assert r.status_code == 429
    assert 1 <= int(r.headers["Retry-After"]) <= 120
    err = r.json()["error"]
    assert err["type"] == "rate_limit_error" and "rpm=2" in err["message"] and "acme" in err["message"]
    assert engine.stats.requests == 2  # the refused request never reached the engine


async def test_usage_api_scopes_formats_and_exact_totals(engine: FakeEngine, gw: RunningGateway) -> None:
    engine_usage: dict[str, list[Usage]] = {"acme": [], "globex": []}
    async with httpx.AsyncClient(base_url=gw.url) as c:
        for tenant, words, max_tokens in [("acme", 5, 7), ("acme", 11, 3), ("globex", 2, 9)]:
            r = await c.post("/v1/chat/completions", json=chat(words=words, max_tokens=max_tokens),
                             headers=auth(tenant))
            assert r.status_code == 200
            engine_usage[tenant].append(Usage.from_openai(r.json()["usage"]))
        async with c.stream("POST", "/v1/chat/completions", headers=auth("globex"),
                            json=chat(words=4, max_tokens=6, stream=True)) as s:
            assert s.status_code == 200
            body = b"".join([chunk async for chunk in s.aiter_bytes()])
        assert b'"usage"' not in body  # the client did not ask for usage: stripped
        engine_usage["globex"].append(Usage(prompt_tokens=4, completion_tokens=6))
        await drain(gw)

        own = (await c.get("/v1/usage", headers=auth("acme"))).json()
        assert own["scope"] == "acme" and {g["tenant"] for g in own["by_tenant"]} == {"acme"}
        rates = list_rates(ListPrice.model_validate(PRICE))
        for tenant in ("acme", "globex"):
            report = (await c.get("/v1/usage", params={"tenant": tenant}, headers=auth("admin"))).json()
            totals = report["totals"]
            assert totals["prompt_tokens"] == sum(u.prompt_tokens for u in engine_usage[tenant])
            assert totals["completion_tokens"] == sum(u.completion_tokens for u in engine_usage[tenant])
            assert totals["cost_micros"] == sum(cost_micros(u, rates) for u in engine_usage[tenant])
            assert totals["requests"] == len(engine_usage[tenant])
        everyone = (await c.get("/v1/usage", headers=auth("admin"))).json()
        assert everyone["scope"] == "all" and {g["tenant"] for g in everyone["by_tenant"]} == {"acme", "globex"}

        r = await c.get("/v1/usage", params={"tenant": "globex"}, headers=auth("acme"))
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        r = await c.get("/v1/usage")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = await c.get("/v1/usage", params={"start": "not-a-date"}, headers=auth("admin"))
        assert r.status_code == 400

        r = await c.get("/v1/usage", params={"format": "csv"}, headers=auth("admin"))
        assert r.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(r.text)))
        assert sum(int(x["cost_micros"]) for x in rows) == everyone["totals"]["cost_micros"]

        budgets = (await c.get("/v1/usage/budgets", headers=auth("acme"))).json()
        (mine,) = budgets["data"]
        assert mine["tenant"] == "acme" and mine["daily_budget_usd"] == 10
        assert mine["windows"]["daily_budget"]["used"] == own["totals"]["cost_micros"]  # settled, nothing in flight

        metrics = (await c.get(gw.metrics_url)).text
    assert 'fleetgate_tenant_cost_usd_total{model="m1",tenant="acme",tier=""}' in metrics
    assert 'llm_cost_per_million_tokens{cost_basis="list",model_name="m1",phase="generation"} 2.0' in metrics
    assert 'fleetgate_time_to_first_token_seconds_count{model="m1",tenant="globex"' in metrics


async def test_cost_page_is_served_with_a_strict_policy(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gw.url) as c:
        page = await c.get("/dashboard")
        script = await c.get("/dashboard/app.js")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<script src="/dashboard/app.js">' in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no CDN, nothing external
    assert script.status_code == 200 and "/v1/usage" in script.text
