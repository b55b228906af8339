"""An encoder's model behind the gateway (a route with `task: embed`): listed as an embedding model, and
chat or completions for it are refused with a clear 400 instead of reaching an engine that cannot answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from fleetgate.gateway.settings import GatewaySettings
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway


async def test_chat_to_an_embedding_model_is_refused_and_the_listing_marks_it(
    engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    settings = GatewaySettings.model_validate({"server": {"auth": "open"}, "models": [
        {"name": "m1", "endpoints": [engine.url]},
        {"name": "all-minilm-l6-v2", "endpoints": [engine.url], "task": "embed"}]})
    gw = await start_gateway(settings)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        chat = await client.post("/v1/chat/completions", json={
            "model": "all-minilm-l6-v2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        completion = await client.post("/v1/completions", json={"model": "all-minilm-l6-v2", "prompt": "hi"})
        fine = await client.post("/v1/chat/completions", json={
            "model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        listing = (await client.get("/v1/models")).json()
    for refused in (chat, completion):
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "model" and "embedding model" in error["message"]
    assert fine.status_code == 200
    assert len(engine.received) == 1  # the refused requests never reached an engine
    tasks = {m["id"]: m["fleetgate"].get("task") for m in listing["data"]}
    assert tasks == {"m1": None, "all-minilm-l6-v2": "embed"}


async def test_the_responses_and_messages_routes_refuse_an_embedding_model_and_embeddings_reach_it(
    engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    settings = GatewaySettings.model_validate({"server": {"auth": "open"}, "models": [
        {"name": "all-minilm-l6-v2", "endpoints": [engine.url], "task": "embed"}]})
    gw = await start_gateway(settings)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        responses = await client.post("/v1/responses", json={"model": "all-minilm-l6-v2", "input": "hi"})
        messages = await client.post("/v1/messages", json={
            "model": "all-minilm-l6-v2", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        embeddings = await client.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": ["a b", "c"]})
    assert responses.status_code == 400
    assert responses.json()["error"]["param"] == "model" and "embedding model" in responses.json()["error"]["message"]
    assert messages.status_code == 400 and messages.json()["type"] == "error"  # Anthropic's shape
    assert messages.json()["error"]["type"] == "invalid_request_error" and "embedding model" in messages.text
    assert embeddings.status_code == 200 and len(embeddings.json()["data"]) == 2
    assert [r.path for r in engine.received] == ["/v1/embeddings"]  # the refused requests never reached it
