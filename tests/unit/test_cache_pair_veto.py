"""The pair veto (`semantic.pair_veto`): asked on would-be hits only, obeyed, and failing safe.

A scripted scorer stands in for the cross-encoder (the shipped one: tests/component/test_cache_pair_veto.py).
The stored prompt and the asked one differ by an added sentence, which the word match leaves to the pair model;
`min_confidence` is set low so that the pair model accepts it (a would-be hit) with the hashing embedder.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from fleetgate.cache.config import CacheConfig, PairVetoConfig, SemanticConfig
from fleetgate.cache.embedding import HashingEmbedder
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.pairveto import OnnxPairScorer
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import CacheStatus
from fleetgate.core.kvstore import MemoryKVStore

from .cache_requests import chat_answer
from .cache_requests import chat_request as req

STORED = "How do I sort a slice in Go?"
WOULD_BE_HIT = "How do I sort a slice in Go? I am asking for a friend."  # reaches the pair model
WORD_MATCH = "In Go, how do I sort a slice?"  # every word matched: no model asked
NEAR_MISS = "How do I sort 3 slices in Go?"  # the verifier's number veto: rejected before any model
UNRELATED = "What is the boiling point of water at sea level?"


class Scripted:
    """A deterministic scorer: `p` for every pair; records calls; `fail_load` / `fail_score` raise."""

    def __init__(self, p: float, *, fail_load: bool = False, fail_score: bool = False, delay_s: float = 0.0) -> None:
        self.p, self.fail_load, self.fail_score, self.delay_s = p, fail_load, fail_score, delay_s
        self.calls: list[tuple[str, str]] = []
        self.loads = 0

    def load(self) -> None:
        import time

        self.loads += 1
        time.sleep(self.delay_s)
        if self.fail_load:
            raise RuntimeError("no model here")

    def probability(self, a: str, b: str) -> float:
        self.calls.append((a, b))
        if self.fail_score:
            raise RuntimeError("session broke")
        return self.p


ANSWER = chat_answer("slices.Sort(s)")


def config(*, enabled: bool = True, threshold: float = 0.2) -> CacheConfig:
    return CacheConfig(semantic=SemanticConfig(embedder="hashing", threshold=0.5, min_confidence=0.05,
                                               pair_veto=PairVetoConfig(enabled=enabled, threshold=threshold)))


async def cache_with(scorer: Any, cfg: CacheConfig | None = None) -> TwoLayerCache:
    cache = TwoLayerCache(config=cfg or config(), kvstore=MemoryKVStore(), embedder=HashingEmbedder(),
                          metrics=CacheMetrics(CollectorRegistry()), pair_veto=scorer)
    first = await cache.lookup(req(STORED))
    await cache.store(req(STORED), first, ANSWER)
    return cache


def rejected(cache: TwoLayerCache, reason: str) -> float:
    return float(cache.metrics.rejections.labels(reason)._value.get())


async def test_a_would_be_hit_is_served_when_the_veto_passes_it_and_refused_when_it_does_not() -> None:
    passes = Scripted(0.2)  # at the threshold: passes (refused strictly below)
    cache = await cache_with(passes)
    hit = await cache.lookup(req(WOULD_BE_HIT))
    assert hit.status == CacheStatus.HIT_SEMANTIC
    assert passes.calls == [(STORED, WOULD_BE_HIT)]

    refuses = Scripted(0.19)
    cache = await cache_with(refuses)
    miss = await cache.lookup(req(WOULD_BE_HIT))
    assert miss.status == CacheStatus.MISS and "pair_veto" in miss.reason
    assert refuses.calls == [(STORED, WOULD_BE_HIT)] and rejected(cache, "pair_veto") == 1


async def test_the_threshold_is_the_setting() -> None:
    cache = await cache_with(Scripted(0.6), config(threshold=0.7))
    assert (await cache.lookup(req(WOULD_BE_HIT))).status == CacheStatus.MISS
    cache = await cache_with(Scripted(0.6), config(threshold=0.5))
    assert (await cache.lookup(req(WOULD_BE_HIT))).status == CacheStatus.HIT_SEMANTIC


async def test_disabled_it_is_never_asked() -> None:
    scorer = Scripted(0.0)
    cache = await cache_with(scorer, config(enabled=False))
    assert cache.veto is None
    assert (await cache.lookup(req(WOULD_BE_HIT))).status == CacheStatus.HIT_SEMANTIC
    assert scorer.calls == [] and scorer.loads == 0


@pytest.mark.parametrize("text", [UNRELATED, NEAR_MISS, WORD_MATCH, STORED])
async def test_misses_rejections_word_matches_and_exact_hits_never_call_it(text: str) -> None:
    scorer = Scripted(0.0)  # would refuse anything it were asked
    cache = await cache_with(scorer)
    result = await cache.lookup(req(text))
    expected = {UNRELATED: CacheStatus.MISS, NEAR_MISS: CacheStatus.MISS, WORD_MATCH: CacheStatus.HIT_SEMANTIC,
                STORED: CacheStatus.HIT_EXACT}[text]
    assert result.status == expected
    assert scorer.calls == [] and scorer.loads == 0  # not even loaded


async def test_a_pair_the_pair_model_rejects_never_calls_it() -> None:
    scorer = Scripted(1.0)
    shipped_bar = CacheConfig(semantic=SemanticConfig(embedder="hashing", threshold=0.5))  # min_confidence: the model's
    cache = await cache_with(scorer, shipped_bar)
    result = await cache.lookup(req(WOULD_BE_HIT))
    assert result.status == CacheStatus.MISS and "constraint" in result.reason
    assert scorer.calls == [] and scorer.loads == 0


async def test_a_veto_that_fails_to_load_makes_would_be_hits_misses() -> None:
    scorer = Scripted(0.99, fail_load=True)
    cache = await cache_with(scorer)
    for _ in range(2):
        miss = await cache.lookup(req(WOULD_BE_HIT))
        assert miss.status == CacheStatus.MISS and miss.reason.startswith("pair veto unavailable")
    assert scorer.calls == [] and scorer.loads == 1  # the failed load is not retried per lookup
    assert rejected(cache, "pair_veto_unavailable") == 2
    # the rest of the cache works: exact and word-matched hits are served
    assert (await cache.lookup(req(STORED))).status == CacheStatus.HIT_EXACT
    assert (await cache.lookup(req(WORD_MATCH))).status == CacheStatus.HIT_SEMANTIC


async def test_a_veto_that_fails_to_score_makes_the_lookup_a_miss() -> None:
    cache = await cache_with(Scripted(0.99, fail_score=True))
    miss = await cache.lookup(req(WOULD_BE_HIT))
    assert miss.status == CacheStatus.MISS and miss.reason.startswith("pair veto unavailable")


async def test_the_shipped_scorer_without_its_adapters_fails_safe_and_logs_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    scorer = OnnxPairScorer(model_dir=tmp_path, adapters=tmp_path / "missing.safetensors")
    caches = [await cache_with(scorer), await cache_with(scorer)]  # e.g. the evaluation's cache per row
    with caplog.at_level(logging.ERROR, logger="fleetgate.cache"):
        for cache in caches * 2:
            assert (await cache.lookup(req(WOULD_BE_HIT))).status == CacheStatus.MISS
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "pair veto did not load" in errors[0].getMessage()
    with pytest.raises(FileNotFoundError):
        scorer.probability("a", "b")  # the same error again, at once


async def test_a_serving_cache_answers_miss_while_the_veto_loads_then_uses_it() -> None:
    scorer = Scripted(0.9, delay_s=0.3)
    cache = await cache_with(scorer)
    await cache.start()  # a serving cache: models load in the background
    await cache.warm_up()  # the embedder and word tables; not the veto (first would-be hit)
    assert scorer.loads == 0
    warming = await cache.lookup(req(WOULD_BE_HIT))
    assert warming.status == CacheStatus.MISS and warming.reason.startswith("pair veto warming up")
    assert cache.veto is not None and cache.veto.loading is not None
    await asyncio.wait([cache.veto.loading])
    assert (await cache.lookup(req(WOULD_BE_HIT))).status == CacheStatus.HIT_SEMANTIC
    assert scorer.loads == 1 and len(scorer.calls) == 1
    await cache.aclose()


async def test_preload_loads_it_at_start_up() -> None:
    scorer = Scripted(0.9)
    cfg = config()
    cfg = cfg.model_copy(update={"semantic": cfg.semantic.model_copy(update={"preload": True})})
    cache = TwoLayerCache(config=cfg, kvstore=MemoryKVStore(), embedder=HashingEmbedder(),
                          metrics=CacheMetrics(CollectorRegistry()), pair_veto=scorer)
    await cache.start()
    await cache.warm_up()
    assert scorer.loads == 1 and scorer.calls == []
    await cache.aclose()


def test_a_minilm_cache_gets_the_shipped_scorer_unloaded_when_on_and_the_hashing_embedder_none() -> None:
    from fleetgate.cache.embedding import BatchingEmbedder, OnnxMiniLMEmbedder
    from fleetgate.cache.pairveto import default_scorer

    minilm = BatchingEmbedder(embedder=OnnxMiniLMEmbedder(variant="int8"), max_batch=4, max_wait_s=0.0)
    cache = TwoLayerCache(config=CacheConfig(), kvstore=MemoryKVStore(), embedder=minilm,
                          metrics=CacheMetrics(CollectorRegistry()))
    assert cache.veto is None  # off by default
    cache = TwoLayerCache(config=config(), kvstore=MemoryKVStore(), embedder=minilm,
                          metrics=CacheMetrics(CollectorRegistry()))
    assert cache.veto is not None
    assert cache.veto.scorer is default_scorer(None)  # one per process, loaded on the first would-be hit only
    assert isinstance(cache.veto.scorer, OnnxPairScorer) and cache.veto.scorer._loaded is None
    cache = TwoLayerCache(config=config(), kvstore=MemoryKVStore(), embedder=HashingEmbedder(),
                          metrics=CacheMetrics(CollectorRegistry()))
    assert cache.veto is None


def test_the_setting_validates() -> None:
    default = SemanticConfig().pair_veto
    assert default.enabled is False and default.threshold == 0.2  # opt-in: no gain on the held-out frozen5
    assert SemanticConfig.model_validate({"pair_veto": {"enabled": True}}).pair_veto.enabled is True
    for bad in ({"threshold": 0}, {"threshold": 1}, {"threshold": 1.5}, {"threshold": "high"}, {"enable": True}):
        with pytest.raises(ValidationError):
            SemanticConfig.model_validate({"pair_veto": bad})
