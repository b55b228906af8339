"""The static prefilter of the semantic cache: the encoder runs only when a candidate survives the text checks,
and every decision is the one the cache makes without the prefilter.

Both embedders are hashing ones (no model): a 64-dimension one stands for the static table, a counting
256-dimension one for the encoder, so the tests see exactly when a prompt was encoded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from fleetgate.cache.config import CacheConfig
from fleetgate.cache.embedding import HashingEmbedder
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.sharedindex import LogEntry, SharedIndex
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import CacheRequest, CacheStatus
from fleetgate.core.kvstore import MemoryKVStore, StoreUnavailableError


class CountingEmbedder(HashingEmbedder):
    def __init__(self, *, dim: int) -> None:
        super().__init__(dim=dim)
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts += list(texts)
        return super().embed(texts)


def make(*, prefilter: bool = True, kv: MemoryKVStore | None = None,
         config: CacheConfig | None = None) -> tuple[TwoLayerCache, CountingEmbedder]:
    encoder = CountingEmbedder(dim=256)
    cache = TwoLayerCache(config=config or CacheConfig(), kvstore=kv or MemoryKVStore(), embedder=encoder,
                          metrics=CacheMetrics(CollectorRegistry()),
                          prefilter=HashingEmbedder(dim=64) if prefilter else None)
    return cache, encoder


def req(text: str, *, tenant: str = "t") -> CacheRequest:
    return CacheRequest(tenant=tenant, model="m", kind="chat",
                        body={"messages": [{"role": "user", "content": text}], "temperature": 0})


def answer(text: str) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer: {text}"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}}


async def remember(cache: TwoLayerCache, text: str, *, tenant: str = "t") -> None:
    first = await cache.lookup(req(text, tenant=tenant))
    assert first.status == CacheStatus.MISS
    await cache.store(req(text, tenant=tenant), first, answer(text))


def metric(cache: TwoLayerCache, outcome: str) -> float:
    return cache.metrics.prefilter.labels(outcome)._value.get()


async def test_a_lookup_with_nothing_near_is_a_miss_that_never_encodes() -> None:
    cache, encoder = make()
    await remember(cache, "In Python, how do I reverse a string?")
    missed = await cache.lookup(req("What is the boiling point of water at sea level?"))
    assert missed.status == CacheStatus.MISS and missed.embedding is None
    assert encoder.texts == []  # neither the stored prompt nor the new one was encoded
    assert metric(cache, "skipped") == 2 and metric(cache, "encoded") == 0
    assert cache.metrics.entries.labels("semantic")._value.get() == 1


async def test_a_vetoed_neighbour_is_rejected_before_encoding() -> None:
    cache, encoder = make()
    await remember(cache, "Question 5: how do I reverse a list in Python without copying it?")
    looked = await cache.lookup(req("Question 7: how do I reverse a list in Python without copying it?"))
    assert looked.status == CacheStatus.MISS
    assert looked.reason == "near miss rejected (number, before encoding)"
    assert encoder.texts == []
    assert cache.metrics.rejections.labels("number")._value.get() == 1


def accepting() -> CacheConfig:
    """The pair model accepts whatever reaches it (the hashing embedder's similarities mean nothing)."""
    config = CacheConfig()
    return config.model_copy(update={"semantic": config.semantic.model_copy(update={"min_confidence": 0.0})})


async def test_a_surviving_candidate_is_encoded_then_and_the_paraphrase_hits() -> None:
    cache, encoder = make(config=accepting())
    await remember(cache, "In Python, how do I reverse a string?")
    hit = await cache.lookup(req("How do I reverse a Python string?"))  # a word left over: the pair model decides
    assert hit.status == CacheStatus.HIT_SEMANTIC and hit.similarity is not None
    # the query, and the stored prompt (stored without the encoder's vector), each encoded once
    assert sorted(encoder.texts) == ["How do I reverse a Python string?", "In Python, how do I reverse a string?"]
    assert metric(cache, "encoded") == 1
    assert hit.embedding is not None
    await cache.lookup(req("How would I reverse a Python string?"))
    assert encoder.texts.count("In Python, how do I reverse a string?") == 1  # kept: not encoded again


async def test_a_candidate_whose_every_word_matched_is_served_without_encoding() -> None:
    cache, encoder = make()
    await remember(cache, "In Python, how do I reverse a string?")
    hit = await cache.lookup(req("how do you reverse a strng in Python?"))  # other function words, a typo
    assert hit.status == CacheStatus.HIT_SEMANTIC and hit.similarity is None and hit.embedding is None
    assert (hit.response or {})["choices"][0]["message"]["content"] == "answer: In Python, how do I reverse a string?"
    assert encoder.texts == [] and metric(cache, "matched") == 1 and metric(cache, "encoded") == 0
    assert hit.state["entry"]  # an answer check or eviction can name the entry served


async def test_with_answer_checks_a_full_match_is_still_encoded() -> None:
    """An answer check's per-entry bar is a similarity: without the encoder there is none to compare."""
    from fleetgate.cache.config import AnswerCheckConfig

    config = CacheConfig()
    config = config.model_copy(update={"semantic": config.semantic.model_copy(
        update={"answer_check": AnswerCheckConfig()})})
    cache, _ = make(config=config)
    await remember(cache, "In Python, how do I reverse a string?")
    looked = await cache.lookup(req("how do you reverse a strng in Python?"))
    assert looked.state["vector"] is not None and metric(cache, "matched") == 0 and metric(cache, "encoded") == 1


async def test_entries_of_another_tenant_never_survive_and_never_cost_an_encode() -> None:
    cache, encoder = make()
    await remember(cache, "In Python, how do I reverse a string?", tenant="other")
    looked = await cache.lookup(req("How do I reverse a string in Python?"))
    assert looked.status == CacheStatus.MISS and encoder.texts == []


async def test_a_lookup_verifies_at_most_top_k_candidates_however_many_survive() -> None:
    """Among near-duplicates every static neighbour survives the text checks; verifying them all cost a
    token-state encoder pass each. The candidates verified are the encoder's `top_k`, as without the
    prefilter."""
    config = CacheConfig()
    config = config.model_copy(update={"semantic": config.semantic.model_copy(
        update={"threshold": -1.0, "prefilter_threshold": -1.0, "top_k": 3, "prefilter_k": 8})})
    cache = TwoLayerCache(config=config, kvstore=MemoryKVStore(), embedder=CountingEmbedder(dim=256),
                          metrics=CacheMetrics(CollectorRegistry()), prefilter=HashingEmbedder(dim=64))
    for thing in ("a list", "JSON records", "log lines", "user sessions", "database rows", "timestamps"):
        await remember(cache, f"How do I merge {thing} in Python safely?")
    verified: list[float] = []
    inner = cache._verify

    async def counting(cached: str, text: str, **kwargs: Any) -> Any:
        verified.append(kwargs["similarity"])
        return await inner(cached, text, **kwargs)

    cache._verify = counting  # type: ignore[method-assign]
    await cache.lookup(req("How do I merge invoices in Python safely?"))
    assert 1 <= len(verified) <= 3 and verified == sorted(verified, reverse=True)


PROMPTS = [
    "In Python, how do I reverse a string?",
    "How do I reverse a string in Python?",
    "How do I reverse a string in JavaScript?",
    "How do I reverse a list in Python?",
    "Question 5: how do I reverse a list in Python without copying it?",
    "Question 7: how do I reverse a list in Python without copying it?",
    "How do I enable two-factor authentication?",
    "How do I disable two-factor authentication?",
    "how do i enable two factor authentication",
    "What is the capital of Australia?",
    "What is the capital of Austria?",
    "Convert 100 dollars to yen",
    "Convert 100 yen to dollars",
    "Write a haiku about autumn rain.",
    "Could you write a haiku about autumn rain?",
    "What is the boiling point of water at sea level?",
]


@pytest.mark.parametrize("order", [1, 2, 3])
async def test_decisions_equal_those_without_the_prefilter(order: int) -> None:
    rng = np.random.default_rng(order)
    prompts = [PROMPTS[i] for i in rng.permutation(len(PROMPTS))]
    outcomes: list[list[tuple[str, str | None]]] = []
    for prefilter in (True, False):
        cache, _ = make(prefilter=prefilter)
        seen: list[tuple[str, str | None]] = []
        for text in prompts:
            found = await cache.lookup(req(text))
            served = (found.response or {}).get("choices", [{}])[0].get("message", {}).get("content")
            seen.append((found.status.value, served))
            if found.status == CacheStatus.MISS:
                await cache.store(req(text), found, answer(text))
        outcomes.append(seen)
    assert outcomes[0] == outcomes[1]
    assert any(status == CacheStatus.HIT_SEMANTIC.value for status, _ in outcomes[0])


def test_log_lines_carry_both_vectors_and_older_lines_still_read() -> None:
    rng = np.random.default_rng(4)
    dense, static = rng.standard_normal(256).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    dense, static = dense / np.linalg.norm(dense), static / np.linalg.norm(static)
    for vector, stat in ((dense, static), (None, static), (dense, None), (None, None)):
        back = LogEntry.decode(LogEntry(key="k", partition="p", expires_at=9e9, vector=vector, static=stat).encode())
        for got, want in ((back.vector, vector), (back.static, stat)):
            assert (got is None) == (want is None)
            if got is not None and want is not None:
                assert np.allclose(got, want, atol=1e-3)
    older = b'{"k":"k","p":"p","e":9e9,"d":256}\n' + dense.astype(np.float16).tobytes()  # no "s": before the prefilter
    back = LogEntry.decode(older)
    assert back.static is None and back.vector is not None and np.allclose(back.vector, dense, atol=1e-3)


def test_the_index_takes_a_late_encoder_vector_and_ignores_vectors_of_another_size() -> None:
    index = SharedIndex(dim=4, max_entries=10, ann_above=100, static_dim=2)
    unit4, unit2 = np.array([1, 0, 0, 0], np.float32), np.array([0, 1], np.float32)
    index.apply(LogEntry(key="a", partition="p", expires_at=9e9, vector=None, static=unit2))
    assert index.static is not None and "a" in index.static and "a" not in index.vectors
    index.add_vector("a", unit4)
    assert index.vectors.search(partition="p", vector=unit4, k=1)[0][0] == "a"
    index.add_vector("gone", unit4)  # not a live entry: nothing to attach it to
    index.apply(LogEntry(key="b", partition="p", expires_at=9e9, vector=np.ones(3, np.float32) / 3**0.5,
                         static=np.ones(5, np.float32) / 5**0.5))  # another replica's settings
    assert "b" not in index.vectors and "b" not in index.static and len(index) == 2
    index.remove("a")
    assert "a" not in index.vectors and "a" not in index.static


def test_a_replica_of_the_version_before_the_prefilter_still_reads_new_lines() -> None:
    rng = np.random.default_rng(5)
    dense, static = rng.standard_normal(256).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    line = LogEntry(key="k", partition="p", expires_at=9e9, vector=dense / np.linalg.norm(dense),
                    static=static / np.linalg.norm(static)).encode()
    # what that version did: the head's k, p, e, d, and the whole body as the encoder's vector
    head, _, body = line.partition(b"\n")
    meta = orjson.loads(head)
    old_vector = np.frombuffer(body, dtype=np.float16) if meta["d"] else None
    assert meta["k"] == "k" and meta["p"] == "p" and old_vector is not None and len(old_vector) == meta["d"] == 256


async def test_an_unreadable_log_line_is_skipped_and_the_lines_after_it_still_sync() -> None:
    kv = MemoryKVStore()
    writer, _ = make(kv=kv)
    await kv.log_append(writer._log, b"not a log line", max_len=100)
    await kv.log_append(writer._log, b'{"k":"x","p":"p","e":9e9,"d":3}\n\x00', max_len=100)  # body too short
    await remember(writer, "In Python, how do I reverse a string?")
    reader, _ = make(kv=kv)
    for _ in range(2):  # the second sync must not trip over the bad lines again
        await reader.sync(force=True)
    assert len(reader.index) == 1
    hit = await reader.lookup(req("How do I reverse a string in Python?"))
    assert hit.status == CacheStatus.HIT_SEMANTIC
    assert reader.metrics.backend_errors._value.get() == 2


class FailingFetch(MemoryKVStore):
    """A store whose MGET fails (Redis gone mid-lookup) once `broken` is set."""

    broken = False

    async def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        if self.broken:
            raise StoreUnavailableError("connection reset")
        return await super().mget(keys)


async def test_a_store_failing_during_the_prefilter_fetch_is_a_bypass_that_encodes_nothing() -> None:
    kv = FailingFetch()
    cache, encoder = make(kv=kv)
    await remember(cache, "In Python, how do I reverse a string?")
    kv.broken = True
    looked = await cache.lookup(req("How do I reverse a string in Python?"))
    assert looked.status == CacheStatus.BYPASS and looked.reason == "cache backend unavailable"
    assert encoder.texts == [] and cache.metrics.backend_up._value.get() == 0


async def test_the_tier_router_gets_only_the_vector_of_the_text_as_written() -> None:
    """The cache embeds a spelling-corrected text; the tier router's scorer was trained on raw texts, so a
    corrected text's vector is not shared (the router embeds the raw text itself)."""
    cache, encoder = make(prefilter=False)
    clean = await cache.lookup(req("How do I reverse a list in Python?"))
    typo = await cache.lookup(req("How do I revrese a lsit in Python?"))
    assert clean.embedding is not None and clean.state["vector"] is not None
    assert typo.embedding is None and typo.state["vector"] is not None
    assert encoder.texts[-1] == "How do I reverse a list in Python?"  # what the cache itself embedded
