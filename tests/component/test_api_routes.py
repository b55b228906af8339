"""`/v1/responses`, `/v1/messages` and `/v1/embeddings` through a real gateway (uvicorn) in front of fake engines,
driven by the official `openai` and `anthropic` clients where a client would be: tenancy and errors in each API's
shape, the charge equal to the engine's usage, `previous_response_id` across gateway and engine replicas (a real
Redis), the reservation of a follow-up, the cache, and the answer to routes the gateway does not serve."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from fleetgate.core.types import Usage
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.stages import NoLimits, Reservation, Tenant
from fleetgate.gateway.tenancy.config import ListPrice
from fleetgate.gateway.tenancy.pricing import cost_micros, list_rates
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway, settings_for
from .test_tenancy_gateway import KEYS, PRICE, auth, settings

Start = Callable[..., Awaitable[Any]]
RATES = list_rates(ListPrice.model_validate(PRICE))  # 1 µ$ a prompt token, 2 a completion token
MESSAGES = [{"role": "user", "content": "alpha beta gamma"}]


class Clients:
    """The official clients of a test, closed at its end."""

    def __init__(self) -> None:
        self.opened: list[openai.AsyncOpenAI | anthropic.AsyncAnthropic] = []

    def openai(self, gw: RunningGateway, tenant: str = "acme") -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEYS.get(tenant, ("x",))[0], max_retries=0)
        self.opened.append(client)
        return client

    def anthropic(self, gw: RunningGateway, tenant: str = "acme") -> anthropic.AsyncAnthropic:
        client = anthropic.AsyncAnthropic(base_url=gw.url, api_key=KEYS.get(tenant, ("x",))[0], max_retries=0)
        self.opened.append(client)
        return client


@pytest.fixture
async def clients() -> AsyncIterator[Clients]:
    made = Clients()
    yield made
    for client in made.opened:
        await client.close()


async def ledger(gw: RunningGateway) -> tuple[dict[str, Any], int]:
    await gw.pipeline.drain()
    async with httpx.AsyncClient(base_url=gw.url) as c:
        totals = (await c.get("/v1/usage", headers=auth("admin"))).json()["totals"]
        budgets = (await c.get("/v1/usage/budgets", headers=auth("acme"))).json()
    return totals, budgets["data"][0]["windows"]["daily_budget"]["used"]


async def test_the_three_apis_with_the_official_clients_are_charged_what_the_engine_processed(
    engine: FakeEngine, start_gateway: Start
, clients: Clients) -> None:
    gw = await start_gateway(settings(engine.url))
    oc, ac = clients.openai(gw), clients.anthropic(gw)
    first = await oc.responses.create(model="m1", input="alpha beta gamma", max_output_tokens=3)
    assert first.output_text == "t0 t1 t2 " and first.model == "m1" and first.usage is not None
    follow = await oc.responses.create(model="m1", input="delta", previous_response_id=first.id, max_output_tokens=2)
    assert follow.previous_response_id == first.id and follow.output_text == "t0 t1 "
    sent = engine.received[-1].body
    assert sent["input"][-1] == {"role": "user", "content": "delta"} and "previous_response_id" not in sent
    assert sent["input"][1]["content"][0]["text"] == "t0 t1 t2 " and sent["store"] is False
    async with oc.responses.stream(model="m1", input="epsilon", max_output_tokens=4) as stream:
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        streamed = await stream.get_final_response()
    assert deltas == ["t0 ", "t1 ", "t2 ", "t3 "] and streamed.usage is not None and streamed.usage.output_tokens == 4
    message = await ac.messages.create(model="m1", max_tokens=3, messages=MESSAGES)  # type: ignore[arg-type]
    assert message.content[0].text == "t0 t1 t2 " and message.usage.input_tokens == 3  # type: ignore[union-attr]
    async with ac.messages.stream(model="m1", max_tokens=2, messages=MESSAGES) as mstream:  # type: ignore[arg-type]
        text = "".join([t async for t in mstream.text_stream])
        final = await mstream.get_final_message()
    assert text == "t0 t1 " and final.usage.output_tokens == 2
    embedded = await oc.embeddings.create(model="m1", input=["alpha beta", "gamma"])
    assert len(embedded.data) == 2 and embedded.usage.prompt_tokens == 3
    totals, counter = await ledger(gw)
    processed = Usage(prompt_tokens=engine.stats.prompt_tokens, completion_tokens=engine.stats.completion_tokens)
    assert (totals["prompt_tokens"], totals["completion_tokens"]) == (processed.prompt_tokens,
                                                                     processed.completion_tokens)
    assert totals["requests"] == 6 and totals["cost_micros"] == cost_micros(processed, RATES) == counter


async def test_errors_come_in_each_apis_own_shape(engine: FakeEngine, start_gateway: Start, clients: Clients) -> None:
    gw = await start_gateway(settings(engine.url, max_body_bytes=20_000))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        no_key = await c.post("/v1/messages", json={"model": "m1", "max_tokens": 1, "messages": MESSAGES})
        assert no_key.status_code == 401
        assert no_key.json() == {"type": "error", "error": {"type": "authentication_error",
                                                            "message": no_key.json()["error"]["message"]}}
        for path in ("/v1/responses", "/v1/embeddings"):
            r = await c.post(path, json={"model": "m1", "input": "x"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        foreign = await c.post("/v1/messages", json={"model": "m2", "max_tokens": 1, "messages": MESSAGES},
                               headers={"x-api-key": KEYS["acme"][0]})  # Anthropic's header
        assert foreign.status_code == 403 and foreign.json()["error"]["type"] == "permission_error"
        unknown = await c.post("/v1/responses", json={"model": "nope", "input": "x"}, headers=auth("globex"))
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        invalid = await c.post("/v1/messages", json={"model": "m1", "messages": MESSAGES}, headers=auth("acme"))
        assert invalid.status_code == 400 and invalid.json()["error"] == {
            "type": "invalid_request_error", "message": "'max_tokens' is required"}
        big = await c.post("/v1/messages", content=b"{" + b" " * 30_000 + b"}", headers=auth("acme"))
        assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
        assert all(r.headers.get("x-request-id") for r in (no_key, foreign, unknown, invalid, big))
    with pytest.raises(anthropic.AuthenticationError):
        await clients.anthropic(gw, "nobody").messages.create(model="m1", max_tokens=1, messages=MESSAGES)  # type: ignore[arg-type]


async def test_a_budget_refuses_every_api_with_retry_after(engine: FakeEngine, start_gateway: Start) -> None:
    tenants = [{"id": "acme", "key_hashes": [KEYS["acme"][1]], "daily_budget_usd": "0.000010"}]  # 10 µ$
    gw = await start_gateway(settings(engine.url, tenants=tenants))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        for path, body in (("/v1/responses", {"model": "m1", "input": "x " * 100, "max_output_tokens": 50}),
                           ("/v1/messages", {"model": "m1", "max_tokens": 50, "messages": MESSAGES}),
                           ("/v1/embeddings", {"model": "m1", "input": ["x " * 100] * 20})):
            r = await c.post(path, json=body, headers=auth("acme"))
            assert r.status_code == 429 and r.headers["retry-after"], (path, r.text)
            error = r.json()["error"]
            assert error["type"] == "rate_limit_error" and "budget" in error["message"], error
    assert engine.stats.requests == 0


async def test_previous_response_id_follows_up_on_another_gateway_replica_and_another_engine(
    redis_url: str, start_engine: Start, start_gateway: Start
, clients: Clients) -> None:
    """Turn 1 through replica A (engine A only), turn 2 through replica B (engine B only), turn 3 through A: each
    engine is sent the whole conversation, including the other engine's answers. vLLM's own store (in the memory
    of the engine that answered) could not serve turn 2."""
    engine_a, engine_b = await start_engine(model="m1"), await start_engine(model="m1")
    gw_a = await start_gateway(settings(engine_a.url, redis_url=redis_url))
    gw_b = await start_gateway(settings(engine_b.url, redis_url=redis_url))
    turn1 = await clients.openai(gw_a).responses.create(model="m1", input="one", max_output_tokens=2)
    turn2 = await clients.openai(gw_b).responses.create(model="m1", input="two", max_output_tokens=3,
                                                       previous_response_id=turn1.id)
    turn3 = await clients.openai(gw_a).responses.create(model="m1", input="three", max_output_tokens=1,
                                                       previous_response_id=turn2.id, stream=False)
    assert turn3.output_text == "t0 " and engine_a.stats.requests == 2 and engine_b.stats.requests == 1
    history = engine_a.received[-1].body["input"]
    assert [i.get("content") if "type" not in i else i["content"][0]["text"] for i in history] == [
        "one", "t0 t1 ", "two", "t0 t1 t2 ", "three"]
    with pytest.raises(openai.NotFoundError) as err:  # another tenant: the id does not exist
        await clients.openai(gw_b, "globex").responses.create(model="m1", input="x", previous_response_id=turn1.id)
    assert err.value.body["code"] == "previous_response_not_found"  # type: ignore[index]


async def test_stored_responses_are_retrieved_deleted_and_only_when_stored(
    engine: FakeEngine, start_gateway: Start
, clients: Clients) -> None:
    gw = await start_gateway(settings(engine.url))
    oc = clients.openai(gw)
    kept = await oc.responses.create(model="m1", input="a", max_output_tokens=1)
    unstored = await oc.responses.create(model="m1", input="a", max_output_tokens=1, store=False)
    assert (await oc.responses.retrieve(kept.id)).output_text == kept.output_text
    with pytest.raises(openai.NotFoundError):
        await oc.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError):
        await oc.responses.create(model="m1", input="b", previous_response_id=unstored.id)
    with pytest.raises(openai.NotFoundError):
        await clients.openai(gw, "globex").responses.retrieve(kept.id)
    await oc.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        await oc.responses.retrieve(kept.id)


class RecordingLimits(NoLimits):
    def __init__(self) -> None:
        self.reserved: list[int] = []

    async def reserve(self, tenant: Tenant, model: str, *, prompt_tokens: int, max_tokens: int | None,
                      sequences: int = 1, fit_max_tokens: bool = False) -> Reservation:
        self.reserved.append(prompt_tokens)
        return await super().reserve(tenant, model, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                                     sequences=sequences, fit_max_tokens=fit_max_tokens)


async def test_a_follow_ups_reservation_counts_the_stored_conversation(
    start_engine: Start, start_gateway: Start
, clients: Clients) -> None:
    engine = await start_engine(model="m1", prompt_count="bytes")
    limits = RecordingLimits()
    gw = await start_gateway(settings_for({"m1": [engine.url]}), limiter=limits)
    oc = clients.openai(gw, "nobody")
    long = "word " * 400
    first = await oc.responses.create(model="m1", input=long, max_output_tokens=50)
    read_first = engine.stats.prompt_tokens
    await oc.responses.create(model="m1", input="and?", previous_response_id=first.id, max_output_tokens=5)
    read_follow = engine.stats.prompt_tokens - read_first
    assert read_follow > read_first  # the engine read the whole conversation again
    assert limits.reserved[0] >= read_first and limits.reserved[1] >= read_follow


async def test_the_cache_serves_repeats_per_tenant_with_new_ids_and_replays_streams(
    engine: FakeEngine, start_gateway: Start
, clients: Clients) -> None:
    config = settings(engine.url).model_dump()
    config["cache"] = {"enabled": True, "store_truncated": True, "semantic": {"enabled": False}}
    gw = await start_gateway(GatewaySettings.model_validate(config))
    oc, ac = clients.openai(gw), clients.anthropic(gw)
    body: dict[str, Any] = {"model": "m1", "input": "same question", "max_output_tokens": 3, "temperature": 0}
    first = await oc.responses.create(**body)
    await gw.pipeline.drain()  # stored after the answer went out
    raw = await oc.responses.with_raw_response.create(**body)
    hit = raw.parse()
    assert raw.headers["x-fleetgate-cache"] == "hit-exact" and engine.stats.requests == 1
    assert hit.output_text == first.output_text and hit.id != first.id and hit.id.startswith("resp_")
    follow = await oc.responses.create(model="m1", input="more", previous_response_id=hit.id, max_output_tokens=1)
    assert follow.previous_response_id == hit.id  # a hit is stored for follow-ups under its own id
    async with oc.responses.stream(**body) as stream:
        replayed = await stream.get_final_response()
    assert replayed.output_text == first.output_text and engine.stats.requests == 2
    other = await clients.openai(gw, "globex").responses.with_raw_response.create(**body)
    assert other.headers["x-fleetgate-cache"] == "miss"  # never across tenants
    msg: dict[str, Any] = {"model": "m1", "max_tokens": 2, "messages": MESSAGES, "extra_body": {"temperature": 0}}
    await ac.messages.create(**msg)
    await gw.pipeline.drain()
    async with ac.messages.stream(**msg) as mstream:
        text = "".join([t async for t in mstream.text_stream])
    assert text == "t0 t1 " and engine.stats.requests == 4  # the stream was the cache's replay
    await oc.embeddings.create(model="m1", input="e")
    await gw.pipeline.drain()
    await oc.embeddings.create(model="m1", input="e")
    assert engine.stats.requests == 6  # embeddings never come from the cache


async def test_the_served_name_is_the_one_the_client_asked_for(
    start_engine: Start, start_gateway: Start, clients: Clients
) -> None:
    engine = await start_engine(model="engine-name")
    gw = await start_gateway(GatewaySettings.model_validate({
        "server": {"auth": "open"},
        "models": [{"name": "public", "endpoints": [engine.url], "served_name": "engine-name"}]}))
    oc = clients.openai(gw, "nobody")
    async with oc.responses.stream(model="public", input="x", max_output_tokens=1) as stream:
        models = {e.response.model async for e in stream if hasattr(e, "response")}
    assert models == {"public"} and engine.received[-1].body["model"] == "engine-name"
    message = await clients.anthropic(gw, "nobody").messages.create(model="public", max_tokens=1,
                                                                    messages=MESSAGES)  # type: ignore[arg-type]
    assert message.model == "public"
    assert (await oc.embeddings.create(model="public", input="x")).model == "public"


async def test_unknown_routes_are_answered_by_the_gateway_never_proxied(
    engine: FakeEngine, start_gateway: Start
) -> None:
    gw = await start_gateway(settings_for({"m1": [engine.url]}))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        for method, path in (("POST", "/v1/audio/speech"), ("GET", "/v1/files"), ("POST", "/tokenize"),
                             ("POST", "/v1/responses/resp_1/cancel")):
            r = await c.request(method, path, json={})
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_route", (path, r.text)
            assert path in r.json()["error"]["message"] and "/v1/responses" in r.json()["error"]["message"]
        messages = await c.post("/v1/messages/count_tokens", json={})
        assert messages.status_code == 404 and messages.json()["type"] == "error"  # Anthropic's shape there
        wrong = await c.get("/v1/embeddings")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
        assert (await c.post("/v1/models")).status_code == 405
    assert engine.stats.requests == 0 and not engine.received


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_the_bound_alone_never_refuses_what_the_engines_exact_count_lets_fit(
    api: str, start_engine: Start, start_gateway: Start
) -> None:
    """Long words: the bound (bytes) is about 10x what the engine reads (words). A budget the bound would refuse
    serves the request: the engine's exact count is asked (`/tokenize` with the chat vLLM renders for a Responses
    request, `/v1/messages/count_tokens` for a Messages one) and reserved instead."""
    engine = await start_engine(model="m1")
    tenants = [{"id": "acme", "key_hashes": [KEYS["acme"][1]], "daily_budget_usd": "0.000500"}]  # 500 µ$
    gw = await start_gateway(settings(engine.url, tenants=tenants))
    text = " ".join(["abcdefghi"] * 100)  # 100 tokens for the engine, ~1,000 bytes for the bound
    body = ({"model": "m1", "input": text, "max_output_tokens": 5} if api == "responses" else
            {"model": "m1", "max_tokens": 5, "messages": [{"role": "user", "content": text}]})
    async with httpx.AsyncClient(base_url=gw.url) as c:
        first = await c.post(f"/v1/{api}", json=body, headers=auth("acme"))
        assert first.status_code == 200, first.text
        assert engine.stats.tokenized == 1 and engine.stats.prompt_tokens == 100
        refused = [(await c.post(f"/v1/{api}", json=body, headers=auth("acme"))).status_code for _ in range(4)]
    totals, counter = await ledger(gw)
    assert refused.count(429) >= 1 and totals["cost_micros"] == counter <= 500
    assert totals["cost_micros"] == cost_micros(Usage(prompt_tokens=engine.stats.prompt_tokens,
                                                      completion_tokens=engine.stats.completion_tokens), RATES)
