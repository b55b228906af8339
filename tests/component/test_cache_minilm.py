"""The cache with the real MiniLM embedder (loaded once for this module from the PyPI-packaged model)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from fleetgate.cache.config import CacheConfig
from fleetgate.cache.embedding import MiniLMEmbedder
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import CacheRequest, CacheStatus
from fleetgate.core.kvstore import MemoryKVStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm() -> Iterator[MiniLMEmbedder]:
    embedder = MiniLMEmbedder()
    embedder.load()
    yield embedder


def make(embedder: MiniLMEmbedder) -> TwoLayerCache:
    return TwoLayerCache(config=CacheConfig(), kvstore=MemoryKVStore(), embedder=embedder,
                         metrics=CacheMetrics(CollectorRegistry()))


def req(text: str) -> CacheRequest:
    return CacheRequest(tenant="t", model="m", kind="chat",
                        body={"messages": [{"role": "user", "content": text}], "temperature": 0})


ANSWER: dict[str, Any] = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "..."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 40, "total_tokens": 52},
}


async def remember(cache: TwoLayerCache, text: str) -> None:
    await cache.store(req(text), await cache.lookup(req(text)), ANSWER)


def test_embeddings_are_unit_vectors_and_paraphrases_are_close(minilm: MiniLMEmbedder) -> None:
    v = minilm.embed(["How do I reset my password?", "What are the steps to reset my password?", "Tomato soup"])
    assert v.shape == (3, 384)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.3


async def test_typo_paraphrase_hits_and_negation_does_not(minilm: MiniLMEmbedder) -> None:
    cache = make(minilm)
    await remember(cache, "How do I enable two-factor authentication on my account?")
    typo = await cache.lookup(req("how do i enable two-factor authentcation on my acount"))
    assert typo.status == CacheStatus.HIT_SEMANTIC, typo.reason
    assert typo.similarity is not None and typo.similarity < 1.0
    flipped = await cache.lookup(req("How do I disable two-factor authentication on my account?"))
    assert flipped.status == CacheStatus.MISS
    assert "negation" in flipped.reason


async def test_embedding_runs_off_the_event_loop(minilm: MiniLMEmbedder) -> None:
    cache = make(minilm)
    await cache.warm_up()  # else lookups answer "warming up" without embedding
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    start_ticks, start = ticks, time.perf_counter()
    prompts = [f"What is a good name for a bakery that sells {x}?" for x in ("bread", "cakes", "pies", "tarts")]
    for text in prompts:
        await cache.lookup(req(text))
    elapsed = time.perf_counter() - start
    done.set()
    await task
    # Were the embedding on the loop, no other coroutine could run during these lookups (the memory
    # store never suspends); off the loop, the ticker keeps running while each prompt is embedded.
    assert ticks - start_ticks >= len(prompts), (ticks - start_ticks, elapsed)


def conv(system: str, history: str, last: str, *, tenant: str = "t", model: str = "m") -> CacheRequest:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": history},
                {"role": "assistant", "content": "Congratulations! Rescue dogs need a few weeks to settle."},
                {"role": "user", "content": last}]
    return CacheRequest(tenant=tenant, model=model, kind="chat", body={"messages": messages, "temperature": 0})


async def test_a_paraphrased_follow_up_hits_but_never_across_history_system_tenant_or_model(
    minilm: MiniLMEmbedder,
) -> None:
    cache = make(minilm)
    stored = conv("You are a vet's assistant.", "I just adopted a rescue dog.", "How do I help him feel at home?")
    first = await cache.lookup(stored)
    answer = {"object": "chat.completion", "model": "m", "usage": {"total_tokens": 5},
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "Give him a quiet corner."},
                           "finish_reason": "stop"}]}
    await cache.store(stored, first, answer)
    follow_up = "How can I help him feel at home, please?"
    assert (await cache.lookup(conv("You are a vet's assistant.", "I just adopted a rescue dog.",
                                     follow_up))).status == CacheStatus.HIT_SEMANTIC
    for other in (conv("You are a vet's assistant.", "I just adopted a rescue cat.", follow_up),
                  conv("You are a landlord's assistant.", "I just adopted a rescue dog.", follow_up),
                  conv("You are a vet's assistant.", "I just adopted a rescue dog.", follow_up, tenant="u"),
                  conv("You are a vet's assistant.", "I just adopted a rescue dog.", follow_up, model="n")):
        assert (await cache.lookup(other)).status == CacheStatus.MISS
