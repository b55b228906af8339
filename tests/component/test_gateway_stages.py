"""The pipeline's contract with its stages, through stub stages: auth, limits, cache, tiers, retries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import orjson
import pytest

from fleetgate.cache.types import CacheLookup, CacheRequest, CacheStatus
from fleetgate.core.errors import AuthenticationError, PermissionDeniedError, RateLimitError
from fleetgate.core.localredis import free_port
from fleetgate.core.types import Endpoint, Usage
from fleetgate.gateway.estimate import estimate_request
from fleetgate.gateway.parsing import parse_request
from fleetgate.gateway.stages import RequestRecord, Reservation, Tenant
from fleetgate.router.tiers.types import TierDecision
from fleetgate.router.types import Decision, RoutingRequest
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import eventually, settings_for

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 2}
ACME = Tenant(id="acme", allowed_models=frozenset({"m1"}))


class KeyAuth:
    async def authenticate(self, authorization: str | None) -> Tenant:
        if authorization != "Bearer good":
            raise AuthenticationError("invalid API key")
        return ACME

    def authorize(self, tenant: Tenant, model: str) -> None:
        if tenant.allowed_models is not None and model not in tenant.allowed_models:
            raise PermissionDeniedError(f"tenant {tenant.id} may not use {model}")


class CountingLimiter:
    def __init__(self, *, limit: int) -> None:
        self.limit = limit
        self.reserved: list[tuple[int, int]] = []
        self.settled: list[Usage] = []

    async def reserve(self, tenant: Tenant, model: str, *, prompt_tokens: int, max_tokens: int | None,
                      sequences: int = 1, fit_max_tokens: bool = False) -> Reservation:
        if len(self.reserved) >= self.limit:
            raise RateLimitError("too many requests", retry_after_s=2.5)
        completion = (max_tokens or 0) * sequences
        self.reserved.append((prompt_tokens, completion))
        return Reservation(tenant=tenant, model=model, estimated_tokens=prompt_tokens + completion,
                           estimated_micros=0)

    async def settle(self, reservation: Reservation, usage: Usage) -> None:
        self.settled.append(usage)


class Ledger:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    async def record(self, record: RequestRecord) -> None:
        self.records.append(record)


class StubCache:
    def __init__(self, hit: dict[str, Any] | None = None) -> None:
        self.hit = hit
        self.lookups: list[CacheRequest] = []
        self.stored: list[Mapping[str, Any]] = []

    async def lookup(self, req: CacheRequest) -> CacheLookup:
        self.lookups.append(req)
        if self.hit is not None and not req.no_cache:
            return CacheLookup(status=CacheStatus.HIT_SEMANTIC, response=self.hit, similarity=0.97)
        return CacheLookup(status=CacheStatus.MISS, embedding=[0.1, 0.2])

    async def store(self, req: CacheRequest, lookup: CacheLookup, response: Mapping[str, Any]) -> None:
        self.stored.append(response)


class StubTiers:
    def __init__(self, decision: TierDecision, *, escalate: str | None = None) -> None:
        self.decision = decision
        self.escalate = escalate
        self.embeddings: list[Any] = []

    def aliases(self) -> list[str]:
        return ["auto"]

    async def resolve(self, requested_model: str, prompt_text: str, *, embedding: Any | None = None) -> TierDecision:
        self.embeddings.append(embedding)
        if requested_model != "auto":
            return TierDecision(model=requested_model)
        return self.decision

    def should_escalate(self, response: dict[str, Any]) -> str | None:
        return self.escalate


class FixedScheduler:
    """Always the first candidate, the second as fallback; records every callback."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def pick(self, req: RoutingRequest, candidates: Sequence[Endpoint]) -> Decision:
        return Decision(endpoint=candidates[0], fallbacks=list(candidates[1:2]), reasons={"fixed": 1.0})

    def on_start(self, req: RoutingRequest, endpoint: Endpoint) -> None:
        self.events.append(("start", endpoint.url))

    def on_first_token(self, req: RoutingRequest, endpoint: Endpoint) -> None:
        self.events.append(("first_token", endpoint.url))

    def on_complete(self, req: RoutingRequest, endpoint: Endpoint, *, ok: bool, usage: Usage | None) -> None:
        self.events.append(("ok" if ok else "failed", endpoint.url))

    def on_connect_error(self, endpoint: Endpoint) -> None:
        self.events.append(("connect_error", endpoint.url))


async def test_401_403_and_429_from_the_stages(start_gateway, engine: FakeEngine) -> None:  # type: ignore[no-untyped-def]
    limiter = CountingLimiter(limit=1)
    gw = await start_gateway(settings_for({"m1": [engine.url], "m2": [engine.url]}), auth=KeyAuth(), limiter=limiter)
    good = {"authorization": "Bearer good"}
    async with httpx.AsyncClient(base_url=gw.url) as client:
        no_key = await client.post("/v1/chat/completions", json=CHAT)
        forbidden = await client.post("/v1/chat/completions", json={**CHAT, "model": "m2"}, headers=good)
        ok = await client.post("/v1/chat/completions", json=CHAT, headers=good)
        limited = await client.post("/v1/chat/completions", json=CHAT, headers=good)
        models = await client.get("/v1/models", headers=good)
        models_no_key = await client.get("/v1/models")
    assert (no_key.status_code, forbidden.status_code, ok.status_code, limited.status_code) == (401, 403, 200, 429)
    assert limited.headers["retry-after"] == "3"
    assert limited.json()["error"]["type"] == "rate_limit_error"
    assert [m["id"] for m in models.json()["data"]] == ["m1"]  # only what the tenant may use
    assert models_no_key.status_code == 401
    assert len(engine.received) == 1
    await gw.pipeline.drain()
    bound = estimate_request(parse_request("chat", orjson.dumps(CHAT))).prompt_tokens
    assert limiter.reserved == [(bound, 2)]  # the prompt's bound (text + chat template), max_tokens
    assert limiter.settled == [Usage(prompt_tokens=3, completion_tokens=2)]


async def test_cache_hit_is_served_without_the_engine_as_json_and_sse(start_gateway, engine: FakeEngine) -> None:  # type: ignore[no-untyped-def]
    cached = {"id": "chatcmpl-c", "object": "chat.completion", "created": 1, "model": "m1",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "cached answer"},
                           "logprobs": None, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    cache, limiter, ledger = StubCache(hit=cached), CountingLimiter(limit=10), Ledger()
    gw = await start_gateway(settings_for({"m1": [engine.url]}), cache=cache, limiter=limiter, accountant=ledger)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        s = await client.post("/v1/chat/completions",
                              json={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.json() == cached
    assert r.headers["x-fleetgate-cache"] == "hit-semantic; similarity=0.9700"
    chunks = [orjson.loads(line[6:]) for line in s.text.split("\n\n") if line.startswith("data: {")]
    assert s.text.endswith("data: [DONE]\n\n")
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 4
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == "cached answer"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == cached["usage"]
    assert len(engine.received) == 0
    await gw.pipeline.drain()
    assert limiter.settled == [Usage(), Usage()]  # no engine tokens were used
    assert [(x.cache_status, x.endpoint, x.usage.completion_tokens) for x in ledger.records] == [
        ("hit-semantic", None, 2), ("hit-semantic", None, 2)
    ]


async def test_cache_miss_stores_complete_responses_and_passes_directives(start_gateway, engine: FakeEngine) -> None:  # type: ignore[no-untyped-def]
    cache = StubCache()
    gw = await start_gateway(settings_for({"m1": [engine.url]}), cache=cache)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        plain = await client.post("/v1/chat/completions", json=CHAT)
        await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        await client.post("/v1/chat/completions", json=CHAT,
                          headers={"cache-control": "no-store", "x-fleetgate-cache-sampled": "true"})
    await gw.pipeline.drain()
    assert plain.headers["x-fleetgate-cache"] == "miss"
    assert len(cache.stored) == 3
    streamed = cache.stored[1]
    assert streamed["object"] == "chat.completion"
    assert streamed["choices"][0]["message"] == {"role": "assistant", "content": "t0 t1 "}
    assert streamed["choices"][0]["finish_reason"] == "length"
    assert streamed["usage"]["completion_tokens"] == 2
    last = cache.lookups[-1]
    assert (last.no_store, last.no_cache, last.allow_sampled, last.tenant, last.kind) == (
        True, False, True, "anonymous", "chat"
    )


async def test_cascade_escalates_and_accounts_both_calls(start_engine, start_gateway) -> None:  # type: ignore[no-untyped-def]
    small, large = await start_engine(model="small"), await start_engine(model="large")
    tiers = StubTiers(TierDecision(model="small", tier="cheap", alias="auto", reason="score",
                                   escalate_to="large", escalate_tier="strong"), escalate="answer too short")
    ledger, limiter = Ledger(), CountingLimiter(limit=10)
    cache = StubCache()
    gw = await start_gateway(settings_for({"small": [small.url], "large": [large.url]}),
                             tiers=tiers, accountant=ledger, limiter=limiter, cache=cache)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "auto"})
        models = await client.get("/v1/models")
    assert r.status_code == 200
    assert r.json()["model"] == "large"
    assert (r.headers["x-fleetgate-model"], r.headers["x-fleetgate-tier"]) == ("large", "strong")
    assert len(small.received) == len(large.received) == 1
    assert tiers.embeddings == [[0.1, 0.2]]  # the cache's embedding is handed to the tier router
    assert "auto" in [m["id"] for m in models.json()["data"]]
    await gw.pipeline.drain()
    assert [(x.model, x.tier) for x in ledger.records] == [("small", "cheap"), ("large", "strong")]
    assert limiter.settled == [Usage(prompt_tokens=6, completion_tokens=4)]
    assert "escalated" in ledger.records[0].extra["cascade"]


async def test_cascade_keeps_the_cheap_answer_when_good_or_streaming(start_engine, start_gateway) -> None:  # type: ignore[no-untyped-def]
    small, large = await start_engine(model="small"), await start_engine(model="large")
    tiers = StubTiers(TierDecision(model="small", tier="cheap", escalate_to="large", escalate_tier="strong"))
    gw = await start_gateway(settings_for({"small": [small.url], "large": [large.url]}), tiers=tiers)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "auto"})
        tiers.escalate = "bad"
        s = await client.post("/v1/chat/completions", json={**CHAT, "model": "auto", "stream": True})
    assert r.json()["model"] == "small" and s.headers["x-fleetgate-model"] == "small"
    assert len(large.received) == 0


async def test_tier_fallback_when_the_model_has_no_reachable_endpoint(start_engine, start_gateway) -> None:  # type: ignore[no-untyped-def]
    large = await start_engine(model="large")
    tiers = StubTiers(TierDecision(model="small", tier="cheap", fallbacks=[("large", "strong")]))
    dead = f"http://127.0.0.1:{free_port()}"
    gw = await start_gateway(settings_for({"small": [dead], "large": [large.url]}), tiers=tiers)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "auto"})
    assert r.status_code == 200
    assert (r.headers["x-fleetgate-model"], r.headers["x-fleetgate-tier"]) == ("large", "strong")


@pytest.mark.parametrize("stream", [False, True])
async def test_connect_failure_is_retried_once_on_the_fallback_endpoint(start_gateway, engine: FakeEngine,
                                                                        stream: bool) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    scheduler = FixedScheduler()
    gw = await start_gateway(settings_for({"m1": [dead, engine.url]}, debug_headers=True), scheduler=scheduler)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        metrics = (await client.get(gw.metrics_url)).text
    assert r.status_code == 200
    assert r.headers["x-fleetgate-endpoint"] == engine.url.removeprefix("http://")
    assert r.headers["x-fleetgate-route-reasons"] == "fixed=1.000"
    await gw.pipeline.drain()
    # The first generated token is reported once, streamed or not (the non-streaming answer is read as a stream):
    # the router's queued-prefill scorer counts the request's prefill as done then.
    assert scheduler.events == [("start", dead), ("failed", dead), ("connect_error", dead),
                                ("start", engine.url), ("first_token", engine.url), ("ok", engine.url)]
    assert 'fleetgate_upstream_retries_total{model="m1"} 1.0' in metrics


async def test_no_retry_after_bytes_reached_the_client(start_engine, start_gateway) -> None:  # type: ignore[no-untyped-def]
    dying = await start_engine(model="m1", drop_after_chunks=1)
    healthy = await start_engine(model="m1")
    scheduler = FixedScheduler()
    gw = await start_gateway(settings_for({"m1": [dying.url, healthy.url]}), scheduler=scheduler)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert '"content":"t0 "' in r.text and '"code":"upstream_error"' in r.text
    assert len(healthy.received) == 0
    assert await eventually(lambda: ("failed", dying.url) in scheduler.events)
    assert scheduler.events == [("start", dying.url), ("first_token", dying.url), ("failed", dying.url)]


async def test_a_failing_tier_router_fails_open_for_explicit_models(start_gateway, engine: FakeEngine) -> None:  # type: ignore[no-untyped-def]
    class BrokenTiers(StubTiers):
        async def resolve(
            self, requested_model: str, prompt_text: str, *, embedding: Any | None = None
        ) -> TierDecision:
            raise RuntimeError("model file missing")

    gw = await start_gateway(settings_for({"m1": [engine.url]}), tiers=BrokenTiers(TierDecision(model="m1")))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        explicit = await client.post("/v1/chat/completions", json=CHAT)
        alias = await client.post("/v1/chat/completions", json={**CHAT, "model": "auto"})
    assert explicit.status_code == 200
    assert alias.status_code == 503 and "alias 'auto'" in alias.json()["error"]["message"]
