"""A request without `max_tokens` from a tenant with a budget is reserved at the model's real context length
(prompt + output), known from the route's `max_model_len` or from discovery (an InferenceService's
`spec.engine.maxModelLen`). It is forwarded without `max_tokens` (the engine stops at its context; a value
from the prompt *estimate* could exceed what the context leaves, which vLLM refuses), unless the budget
lowered it; without any context length the server default is reserved and set upstream."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from fleetgate.gateway.discovery import StaticEndpointSource
from fleetgate.gateway.estimate import estimate_request
from fleetgate.gateway.parsing import parse_request
from fleetgate.gateway.settings import GatewaySettings, ModelRoute

from .test_tenancy_gateway import KEYS, PRICE, auth

BODY = {"model": "m1", "messages": [{"role": "user", "content": "alpha beta gamma delta"}]}


def settings(engine_url: str, *, max_model_len: int | None) -> GatewaySettings:
    return GatewaySettings.model_validate({
        "server": {"auth": "api_key", "default_max_tokens": 16},
        "models": [{"name": "m1", "endpoints": [engine_url], "max_model_len": max_model_len}],
        "tenancy": {
            "tenants": [{"id": "acme", "key_hashes": [KEYS["acme"][1]], "daily_budget_usd": "0.001"},
                        {"id": "globex", "key_hashes": [KEYS["globex"][1]]}],
            "prices": {"m1": PRICE},
        },
    })


class SizedSource(StaticEndpointSource):
    """Discovery that knows each model's context length, as the Kubernetes source does."""

    def __init__(self, routes: list[ModelRoute], context: int) -> None:
        super().__init__(routes)
        self._ctx = context

    def context_length(self, model: str) -> int | None:
        return self._ctx


async def forwarded_max_tokens(gw: Any, engine: Any, key: str) -> Any:
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
        r = await c.post("/v1/chat/completions", json=BODY, headers=auth(key))
    assert r.status_code == 200, r.text
    return engine.received[-1].body.get("max_tokens")


PROMPT = estimate_request(parse_request("chat", orjson.dumps(BODY))).prompt_tokens


async def test_the_routes_context_length_leaves_the_cap_to_the_engine(start_gateway: Any, start_engine: Any) -> None:
    engine = await start_engine(model="m1")
    gw = await start_gateway(settings(engine.url, max_model_len=200))
    assert await forwarded_max_tokens(gw, engine, "acme") is None
    assert await forwarded_max_tokens(gw, engine, "globex") is None  # no limits: nothing to bound


async def test_a_budget_that_lowers_the_reservation_sets_it_upstream(start_gateway: Any, start_engine: Any) -> None:
    engine = await start_engine(model="m1")
    config = settings(engine.url, max_model_len=10**6)  # $2 of output at $2/1M: more than the $0.001 budget
    gw = await start_gateway(config)
    capped = await forwarded_max_tokens(gw, engine, "acme")
    assert isinstance(capped, int) and 1 <= capped < 10**6 - PROMPT


async def test_discovery_context_length_bounds_it_when_the_route_has_none(start_gateway: Any,
                                                                         start_engine: Any) -> None:
    engine = await start_engine(model="m1")
    config = settings(engine.url, max_model_len=None)
    gw = await start_gateway(config, endpoint_source=SizedSource(config.models, context=10**6))
    capped = await forwarded_max_tokens(gw, engine, "acme")  # the budget lowers the context-sized reservation
    assert isinstance(capped, int) and 1 <= capped < 10**6 - PROMPT
    gw_small = await start_gateway(config, endpoint_source=SizedSource(config.models, context=300))
    assert await forwarded_max_tokens(gw_small, engine, "acme") is None  # fits the budget: the engine caps it


async def test_without_any_context_length_the_server_default_applies(start_gateway: Any, start_engine: Any) -> None:
    engine = await start_engine(model="m1")
    gw = await start_gateway(settings(engine.url, max_model_len=None))
    assert await forwarded_max_tokens(gw, engine, "acme") == 16
