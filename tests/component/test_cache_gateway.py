"""The response cache inside a real gateway (uvicorn) in front of a fake engine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson

from fleetgate.cache.config import CacheConfig, SemanticConfig
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway, eventually, settings_for

Q = "In Python, how do I reverse a string?"
Q_REORDERED = "How do I reverse a string in Python?"


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m1", "messages": [{"role": "user", "content": text}], "max_tokens": 4, "temperature": 0,
            **extra}


async def cached_gateway(
    engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> tuple[RunningGateway, TwoLayerCache]:
    settings = settings_for({"m1": [engine.url]}).model_copy(
        # The fake engine always stops at max_tokens (finish_reason "length"), which is not stored by default.
        update={"cache": CacheConfig(store_truncated=True,
                                     semantic=SemanticConfig(embedder="hashing", threshold=0.5))}
    )
    gw = await start_gateway(settings)
    cache = gw.pipeline._s.cache
    assert isinstance(cache, TwoLayerCache)  # built by the gateway's wiring from settings.cache
    return gw, cache


async def test_repeat_and_paraphrase_are_served_from_the_cache(
    engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    gw, cache = await cached_gateway(engine, start_gateway)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        first = await client.post("/v1/chat/completions", json=chat(Q))
        assert first.status_code == 200 and first.headers["x-fleetgate-cache"] == "miss"
        assert await eventually(lambda: len(cache.index) == 1)
        again = await client.post("/v1/chat/completions", json=chat(Q))
        similar = await client.post("/v1/chat/completions", json=chat(Q_REORDERED))
        sampled = await client.post("/v1/chat/completions", json=chat(Q, temperature=0.8))
    assert again.headers["x-fleetgate-cache"] == "hit-exact"
    assert similar.headers["x-fleetgate-cache"].startswith("hit-semantic; similarity=")
    assert sampled.headers["x-fleetgate-cache"] == "bypass"
    for hit in (again, similar):
        assert hit.json()["choices"] == first.json()["choices"]
        assert hit.json()["usage"] == first.json()["usage"]
        assert hit.json()["id"] != first.json()["id"]
    assert len(engine.received) == 2  # the first request and the sampled one


async def test_streamed_miss_is_stored_and_a_hit_is_replayed_as_sse(
    engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    gw, cache = await cached_gateway(engine, start_gateway)
    body = chat(Q, stream=True, stream_options={"include_usage": True})
    async with httpx.AsyncClient(base_url=gw.url) as client:
        streamed = await client.post("/v1/chat/completions", json=body)
        assert streamed.headers["x-fleetgate-cache"] == "miss"
        assert await eventually(lambda: len(cache.index) == 1)
        plain = await client.post("/v1/chat/completions", json=chat(Q))
        replay = await client.post("/v1/chat/completions", json=body)
    assert plain.headers["x-fleetgate-cache"] == "hit-exact"
    assert replay.headers["x-fleetgate-cache"] == "hit-exact"
    assert replay.headers["content-type"].startswith("text/event-stream")

    def text_of(sse: str) -> str:
        chunks = [orjson.loads(line[6:]) for line in sse.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])

    assert text_of(replay.text) == text_of(streamed.text) == plain.json()["choices"][0]["message"]["content"]
    assert len(engine.received) == 1


async def test_cache_control_no_store_is_honoured(
    engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    gw, cache = await cached_gateway(engine, start_gateway)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json=chat(Q), headers={"cache-control": "no-store"})
        again = await client.post("/v1/chat/completions", json=chat(Q))
    assert r.headers["x-fleetgate-cache"] == "bypass"
    assert again.headers["x-fleetgate-cache"] == "miss"
    assert len(engine.received) == 2
    assert await eventually(lambda: len(cache.index) == 1)  # only the second answer was stored


async def test_a_sampled_semantic_hit_is_checked_against_the_engine_at_the_gateway_s_cost(
    engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    from fleetgate.cache.config import AnswerCheckConfig

    settings = settings_for({"m1": [engine.url]}).model_copy(
        update={"cache": CacheConfig(store_truncated=True, semantic=SemanticConfig(
            embedder="hashing", threshold=0.5, answer_check=AnswerCheckConfig(sample_rate=1.0)))}
    )
    gw = await start_gateway(settings)
    cache = gw.pipeline._s.cache
    assert isinstance(cache, TwoLayerCache) and cache.answer_check is not None
    checks = cache.metrics.answer_check
    async with httpx.AsyncClient(base_url=gw.url) as client:
        await client.post("/v1/chat/completions", json=chat(Q))
        assert await eventually(lambda: len(cache.index) == 1)
        similar = await client.post("/v1/chat/completions", json=chat(Q_REORDERED))
    assert similar.headers["x-fleetgate-cache"].startswith("hit-semantic")
    # the client has its answer; the check re-asks the engine in the background and is judged
    assert await eventually(lambda: len(engine.received) == 2)
    judged = lambda: sum(checks.checks.labels(r)._value.get() for r in ("agree", "false_hit"))  # noqa: E731
    assert await eventually(lambda: judged() == 1)
    assert checks.tokens._value.get() > 0  # the gateway's own cost, counted apart from the tenant's
