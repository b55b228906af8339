"""vCache-style answer checks: a sampled semantic hit is re-asked in the background and judged."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fleetgate.cache.config import AnswerCheckConfig, CacheConfig, SemanticConfig
from fleetgate.cache.embedding import HashingEmbedder
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import CacheLookup, CacheRequest, CacheStatus
from fleetgate.core.kvstore import MemoryKVStore, StoreUnavailableError

STORED, ASKED = "In Go, how do I sort a slice?", "How do I sort a slice in Go?"


def req(text: str, temperature: float | None = 0) -> CacheRequest:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
    if temperature is not None:
        body["temperature"] = temperature
    return CacheRequest(tenant="t", model="m", kind="chat", body=body, allow_sampled=True)


def answer(text: str) -> dict[str, Any]:
    return {
        "object": "chat.completion",
        "model": "m",
        "usage": {"total_tokens": 3},
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    }


class DeadDeletes(MemoryKVStore):
    async def delete(self, key: str) -> None:
        raise StoreUnavailableError("redis is down")


async def cache_with(check: AnswerCheckConfig | None, kv: MemoryKVStore | None = None) -> TwoLayerCache:
    config = CacheConfig(semantic=SemanticConfig(embedder="hashing", threshold=0.5, answer_check=check))
    cache = TwoLayerCache(
        config=config,
        kvstore=kv or MemoryKVStore(),
        embedder=HashingEmbedder(),
        metrics=CacheMetrics(CollectorRegistry()),
    )
    first = await cache.lookup(req(STORED))
    await cache.store(req(STORED), first, answer("Use slices.Sort(s)."))
    return cache


def counted(cache: TwoLayerCache, result: str) -> float:
    return cache.metrics.answer_check.checks.labels(result)._value.get()


def engine(text: str, calls: list[str] | None = None, delay: float = 0.0) -> Any:
    async def ask() -> tuple[str, int]:
        await asyncio.sleep(delay)
        if calls is not None:
            calls.append(text)
        return text, 12

    return ask


ALWAYS = AnswerCheckConfig(sample_rate=1.0, answer_similarity=0.999, evict_after=2)


async def test_off_by_default_nothing_is_sampled_and_no_bar_applies() -> None:
    cache = await cache_with(None)
    hit = await cache.lookup(req(ASKED))
    assert hit.status == CacheStatus.HIT_SEMANTIC and cache.answer_check is None
    assert cache.check_hit(req(ASKED), hit, ask=engine("x")) is None


async def test_a_different_answer_raises_the_entry_bar_then_evicts_it() -> None:
    cache = await cache_with(ALWAYS)
    hit = await cache.lookup(req(ASKED))
    assert hit.status == CacheStatus.HIT_SEMANTIC and hit.similarity is not None
    task = cache.check_hit(req(ASKED), hit, ask=engine("Call sort.Ints on it, descending."))
    assert task is not None
    await task
    assert counted(cache, "false_hit") == 1 and cache.metrics.answer_check.tokens._value.get() == 12
    assert cache.answer_check is not None and cache.answer_check.bar(hit.state["entry"]) > hit.similarity
    refused = await cache.lookup(req(ASKED))
    assert refused.status == CacheStatus.MISS and "answer-checked bar" in refused.reason
    assert cache.metrics.answer_check.false_hit_rate._value.get() == pytest.approx(2 / 3)
    # a second false hit on the same entry (seen at a higher similarity) evicts it
    await cache.answer_check.record(key=hit.state["entry"], similarity=0.99, agree=False)
    assert cache.metrics.answer_check.evictions._value.get() == 1
    assert len(cache.index.vectors) == 0 and (await cache.kv.get(cache._key(hit.state["entry"]))) is None


async def test_the_same_answer_agrees_and_changes_nothing() -> None:
    cache = await cache_with(ALWAYS)
    hit = await cache.lookup(req(ASKED))
    task = cache.check_hit(req(ASKED), hit, ask=engine("Use   slices.Sort(s)."))  # whitespace does not count
    assert task is not None
    await task
    assert counted(cache, "agree") == 1 and cache.answer_check is not None
    assert cache.answer_check.bar(hit.state["entry"]) < 0
    assert (await cache.lookup(req(ASKED))).status == CacheStatus.HIT_SEMANTIC


async def test_only_greedy_hits_are_checked_and_busy_or_broke_engines_are_skipped() -> None:
    cache = await cache_with(ALWAYS)
    hit = await cache.lookup(req(ASKED))
    calls: list[str] = []
    assert cache.check_hit(req(ASKED, temperature=0.7), hit, ask=engine("x", calls)) is None
    assert cache.check_hit(req(ASKED, temperature=None), hit, ask=engine("x", calls)) is None
    assert cache.check_hit(req(ASKED), hit, ask=engine("x", calls), busy=lambda: True) is None
    assert cache.check_hit(req(ASKED), hit, ask=engine("x", calls), budget_left=lambda: False) is None
    exact = CacheLookup(status=CacheStatus.HIT_EXACT, response=answer("y"))
    assert cache.check_hit(req(ASKED), exact, ask=engine("x", calls)) is None
    assert calls == [] and counted(cache, "skipped_busy") == 1 and counted(cache, "skipped_budget") == 1


async def test_concurrency_is_bounded_and_extra_checks_are_skipped_not_queued() -> None:
    cache = await cache_with(AnswerCheckConfig(sample_rate=1.0, max_in_flight=1))
    hit = await cache.lookup(req(ASKED))
    first = cache.check_hit(req(ASKED), hit, ask=engine("Use slices.Sort(s).", delay=0.05))
    assert first is not None
    assert cache.check_hit(req(ASKED), hit, ask=engine("Use slices.Sort(s).")) is None
    assert counted(cache, "skipped_concurrency") == 1
    await first


async def test_a_client_leaving_does_not_cancel_or_leak_the_check() -> None:
    cache = await cache_with(ALWAYS)
    hit = await cache.lookup(req(ASKED))
    calls: list[str] = []
    started: list[asyncio.Task[None] | None] = []

    async def request() -> None:  # the request task: starts the check, then the client hangs up
        started.append(cache.check_hit(req(ASKED), hit, ask=engine("Something else entirely.", calls, delay=0.05)))
        await asyncio.sleep(10)

    client = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    client.cancel()
    with pytest.raises(asyncio.CancelledError):
        await client
    check = started[0]
    assert check is not None and not check.cancelled()
    await check
    assert calls == ["Something else entirely."] and counted(cache, "false_hit") == 1
    assert cache.answer_check is not None and not cache.answer_check._tasks  # nothing left running


async def test_a_failing_engine_or_a_dead_store_never_raises() -> None:
    cache = await cache_with(
        AnswerCheckConfig(sample_rate=1.0, evict_after=1, answer_similarity=0.999), kv=DeadDeletes()
    )
    hit = await cache.lookup(req(ASKED))

    async def broken() -> tuple[str, int]:
        raise ConnectionError("engine went away")

    task = cache.check_hit(req(ASKED), hit, ask=broken)
    assert task is not None
    await task
    assert counted(cache, "error") == 1
    task = cache.check_hit(req(ASKED), hit, ask=engine("A different answer."))
    assert task is not None
    await task  # the eviction fails on the dead store: the entry's bar still keeps it out
    assert counted(cache, "false_hit") == 1
    assert (await cache.lookup(req(ASKED))).status == CacheStatus.MISS


def test_the_floor_keeps_the_checked_false_hit_rate_under_the_bound() -> None:
    from fleetgate.cache.answercheck import AnswerChecker

    async def nothing(key: str) -> None:
        return None

    checker = AnswerChecker(
        config=AnswerCheckConfig(max_false_hit_rate=0.1, evict_after=99),
        metrics=CacheMetrics(CollectorRegistry()).answer_check,
        embed=None,
        evict=nothing,
    )
    assert checker.floor() == -1.0

    async def feed() -> None:
        for i in range(20):  # hits at 0.90..0.99 all agree, at 0.70..0.79 half are false
            await checker.record(key=f"k{i}", similarity=0.9 + i / 200, agree=True)
            await checker.record(key=f"j{i}", similarity=0.7 + i / 200, agree=i % 2 == 0)

    asyncio.run(feed())
    floor = checker.floor()
    checked = [(s, f) for s, f in checker._recent if s >= floor]
    assert sum(f for _, f in checked) / len(checked) <= 0.1
    assert 0.7 < floor <= 0.9
