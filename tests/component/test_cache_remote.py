"""The semantic cache with its encoder as a service (`semantic.embedder: remote`), healthy and broken.

The service is `fleetgate.bench.encoder_stub` on loopback: MiniLM float32 vectors of the token ids the cache
sends (the fp32 ONNX graph: what vLLM's pooling runner gives to 1e-6), or one of its faults: a stalled
service (accepts, never answers), a dead one (nothing listens), one answering garbage, one serving another
model. Healthy, the remote cache decides as the in-process fp32 cache does; broken, no lookup fails, none
waits past `timeout_ms`, and what the static prefilter settles without the encoder is still served."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from fleetgate.bench.encoder_stub import STATE, MiniLMVectors, encoder_app, serving
from fleetgate.bench.loadgen import varied_prompt
from fleetgate.cache.build import build_cache
from fleetgate.cache.config import CacheConfig
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import CacheLookup, CacheRequest, CacheStatus
from fleetgate.core.kvstore import MemoryKVStore
from fleetgate.core.localredis import free_port
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway, settings_for

pytestmark = pytest.mark.slow

PROMPT = "How do I reverse a list in Python without copying it?"
PARAPHRASE = "What's the way to reverse a Python list in place, without making a copy?"  # the pair model decides
REWORDED = "Could you tell me how to reverse a list in Python without copyng it?"  # every word matches
PARAPHRASES = [PARAPHRASE, "What is the best way to flip a Python list in place, with no copy made?",
               "How can I reverse a Python list in place, without making a copy of it?",
               "In Python, what's the way to reverse a list in place without making a copy of it?"]
TIMEOUT_MS = 200.0


@pytest.fixture(scope="module")
def minilm() -> MiniLMVectors:
    vectors = MiniLMVectors(table=False)
    vectors.encoder.load()  # not on the first request's time
    return vectors


@asynccontextmanager
async def encoder_service(mode: str, vectors: MiniLMVectors | None) -> AsyncIterator[tuple[str, dict[str, int]]]:
    """A stub encoder on a free port (mode "dead": nothing listens there)."""
    if mode == "dead":
        yield f"http://127.0.0.1:{free_port()}", {"requests": 0}
        return
    app = encoder_app(vectors=vectors, mode=mode)
    async with serving(app) as url:
        yield url, app[STATE]


def remote_config(url: str, **remote: Any) -> CacheConfig:
    return CacheConfig.model_validate({"semantic": {"embedder": "remote", "embed_memo": 0, "remote": {
        "url": url, "timeout_ms": TIMEOUT_MS, "failures_to_open": 2, "retry_after_s": 30, **remote}}})


def request(text: str, *, tenant: str = "t1") -> CacheRequest:
    return CacheRequest(tenant=tenant, model="m", kind="chat",
                        body={"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0})


def answer(text: str) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer to {text}"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


async def stored(cache: TwoLayerCache, text: str) -> None:
    first = await cache.lookup(request(text))
    await cache.store(request(text), first, answer(text))


async def decide(cache: TwoLayerCache, stored_text: str, query: str) -> CacheLookup:
    await stored(cache, stored_text)
    return await cache.lookup(request(query))


PAIRS = [
    (PROMPT, PARAPHRASE),  # a paraphrase the pair model accepts
    ("How do I enable two-factor authentication on GitHub?", "How do I disable two-factor authentication on GitHub?"),
    ("What is the capital of Austria?", "What is the capital of Australia?"),
    ("Summarise this article in 3 bullet points", "Summarise this article in 5 bullet points"),  # number veto
    ("Give me a recipe for banana bread", "How do I make banana bread?"),
    ("how can I recover that file?", "how do I get it back"),
]


@pytest.mark.parametrize("stored_text, query", PAIRS)
async def test_the_remote_cache_decides_as_the_in_process_fp32_cache(minilm: MiniLMVectors, stored_text: str,
                                                                    query: str) -> None:
    async with encoder_service("ok", minilm) as (url, seen):
        remote = build_cache(remote_config(url, timeout_ms=5000), kvstore=MemoryKVStore())  # a busy test box
        local = build_cache(CacheConfig.model_validate({"semantic": {"embedder": "minilm-onnx", "embed_memo": 0}}),
                            kvstore=MemoryKVStore())
        assert isinstance(remote, TwoLayerCache) and isinstance(local, TwoLayerCache)
        got, want = await decide(remote, stored_text, query), await decide(local, stored_text, query)
        await remote.aclose()
        await local.aclose()
    assert (got.status, got.reason) == (want.status, want.reason)
    assert (got.similarity is None) == (want.similarity is None)
    if want.similarity is not None:
        assert abs(got.similarity - want.similarity) < 1e-4  # type: ignore[operator]
    assert seen["requests"] >= (1 if want.state.get("vector") is not None else 0)


@pytest.mark.parametrize("mode, reason", [
    ("stall", "timeout"), ("dead", "error"), ("garbage", "garbage"), ("other-model", "identity")])
async def test_a_broken_encoder_never_fails_or_holds_a_lookup_and_the_prefilter_still_serves(
    minilm: MiniLMVectors, mode: str, reason: str
) -> None:
    registry = CollectorRegistry()
    async with encoder_service(mode, minilm) as (url, _):
        cache = build_cache(remote_config(url), kvstore=MemoryKVStore(), registry=registry)
        assert isinstance(cache, TwoLayerCache)
        await stored(cache, PROMPT)  # the static vector alone: storing needs no encoder
        reasons, slowest = [], 0.0
        for text in PARAPHRASES:  # two failures open the circuit: later lookups do not even wait
            t0 = time.perf_counter()
            found = await cache.lookup(request(text))
            slowest = max(slowest, time.perf_counter() - t0)
            assert found.status == CacheStatus.MISS
            reasons.append(found.reason)
        word_match = await cache.lookup(request(REWORDED))
        exact = await cache.lookup(request(PROMPT))
        await cache.aclose()
    assert slowest < TIMEOUT_MS / 1000 + 0.25
    assert reasons[:2] == [f"encoder unavailable ({reason})"] * 2
    assert reasons[2:] == ["encoder unavailable (circuit_open)"] * 2
    assert word_match.status == CacheStatus.HIT_SEMANTIC  # settled by the static prefilter, no encoder needed
    assert exact.status == CacheStatus.HIT_EXACT
    fallbacks = {r: registry.get_sample_value("fleetgate_cache_encoder_fallbacks_total", {"reason": r})
                 for r in (reason, "circuit_open")}
    assert fallbacks == {reason: 2.0, "circuit_open": 2.0}
    assert registry.get_sample_value("fleetgate_cache_encoder_up") == 0


async def test_with_the_prefilter_off_a_broken_encoder_still_stores_for_exact_hits(minilm: MiniLMVectors) -> None:
    async with encoder_service("dead", minilm) as (url, _):
        config = remote_config(url)
        config = config.model_copy(update={"semantic": config.semantic.model_copy(update={"prefilter": "off"})})
        cache = build_cache(config, kvstore=MemoryKVStore())
        assert isinstance(cache, TwoLayerCache)
        await stored(cache, PROMPT)
        again = await cache.lookup(request(PROMPT))
        other = await cache.lookup(request(PARAPHRASE))
        await cache.aclose()
    assert again.status == CacheStatus.HIT_EXACT
    assert other.status == CacheStatus.MISS and other.reason.startswith("encoder unavailable")


# Long next to what the machine's load adds to a burst of 20 requests served in the test's own process (the
# slowest takes 0.1-0.4 s without the encoder on this 2-core box, alone or beside two busy processes; ~0.85 s in a
# full-suite run), so that what the encoder's stall adds stands out of it.
STALL_TIMEOUT_MS = 1000.0


async def test_the_gateway_answers_every_request_when_its_encoder_stalls(
    minilm: MiniLMVectors, engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    async with encoder_service("stall", minilm) as (url, seen):
        settings = settings_for({"m1": [engine.url]}).model_copy(update={"cache": CacheConfig.model_validate(
            {"store_truncated": True, "semantic": {"embedder": "remote", "preload": True, "remote": {
                "url": url, "timeout_ms": STALL_TIMEOUT_MS, "failures_to_open": 1000}}})})
        gw = await start_gateway(settings)
        cache = gw.pipeline._s.cache
        assert isinstance(cache, TwoLayerCache)
        await cache.warm_up()

        async def ask(client: httpx.AsyncClient, i: int) -> tuple[int, str, float]:
            t0 = time.perf_counter()
            r = await client.post("/v1/chat/completions", json={
                "model": "m1", "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": varied_prompt(i)}]})
            return r.status_code, r.headers["x-fleetgate-cache"], time.perf_counter() - t0

        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
            # The baseline: 20 concurrent questions while nothing is stored, which the prefilter settles as
            # misses without the encoder: the same gateway, engine and client work on this machine, as loaded
            # as it is now, without any wait on the encoder.
            baseline = await asyncio.gather(*(ask(client, i) for i in range(21, 41)))
            asked_before = seen["requests"]
            await asyncio.sleep(0.2)
            # Now each question has stored near neighbours, which only the encoder can settle: it stalls.
            results = await asyncio.gather(*(ask(client, i) for i in range(1, 21)))
    assert [r[:2] for r in baseline] == [(200, "miss")] * 20 and asked_before == 0
    assert [r[:2] for r in results] == [(200, "miss")] * 20
    assert seen["requests"] >= 1  # the lookups did ask the stalled service
    slowest, slowest_baseline = max(r[2] for r in results), max(r[2] for r in baseline)
    # No request waits on the stalled encoder past its timeout: the slowest takes the baseline's time, the
    # timeout and the verifier's checks of the neighbours (a few ms each). The slack is what the machine's
    # load moves between the two bursts (measured: the slowest exceeds baseline + timeout by -0.05 to +0.19 s,
    # alone and beside two busy processes); a second wait on the encoder would be a whole timeout more.
    assert slowest < slowest_baseline + STALL_TIMEOUT_MS / 1000 + 0.5, (slowest, slowest_baseline)
