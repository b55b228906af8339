"""MiniLM's static token table (`fleetgate.core.minilm_static`) and the shipped cache that searches with it."""

from __future__ import annotations

import numpy as np
import pytest

from fleetgate.cache.build import build_cache
from fleetgate.cache.config import CacheConfig
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import CacheRequest, CacheStatus
from fleetgate.core.kvstore import MemoryKVStore
from fleetgate.core.minilm_static import DIM, StaticMiniLM, distill

pytestmark = pytest.mark.slow


def test_distill_reduces_weights_and_removes_the_shared_direction() -> None:
    rng = np.random.default_rng(0)
    raw = rng.standard_normal((50, 12)).astype(np.float32) + 3.0  # every row shares an offset
    raw[2] = raw[0]  # "the" and "kubernetes" given the same encoder vector: only their weights differ
    tokens = ["the", "and", "kubernetes", "mortgage", *(f"zzq{i}" for i in range(46))]
    table = distill(raw, tokens, dim=6)
    assert table.shape == (50, 6) and table.dtype == np.float32
    # "the" is frequent (p ~ 0.05): a / (a + p) ~ 0.4 of a rare word's weight, and direction unchanged
    assert 0.2 < np.linalg.norm(table[0]) / np.linalg.norm(table[2]) < 0.5
    assert float(table[0] @ table[2]) / (np.linalg.norm(table[0]) * np.linalg.norm(table[2])) > 0.999
    # the offset every row shared is gone: the rows no longer all point one way
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    assert abs(float(unit.mean(axis=0) @ unit.mean(axis=0))) < 0.2


def test_static_vectors_are_unit_rows_that_rank_a_paraphrase_first() -> None:
    static = StaticMiniLM()
    v = static.embed(["How do I reset my password?", "What are the steps to reset my password?",
                      "Tomato soup recipe", ""])
    assert v.shape == (4, DIM)
    assert np.allclose(np.linalg.norm(v[:3], axis=1), 1.0, atol=1e-4) and not v[3].any()
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.3
    assert np.array_equal(v[:1], static.embed(["How do I reset my password?"]))


def test_memoised_token_ids_equal_the_tokenizers_on_any_text() -> None:
    """The per-chunk memo must give exactly the ids of encoding the whole text: odd whitespace, control
    characters, accents, CJK, punctuation, long words, truncation at 256 and random strings of those."""
    import random

    static = StaticMiniLM()
    static.load()
    tokenizer = static._tokenizer
    texts = ["How do I reset my password?", "  double  space ", "tab\there", "nl\nthere", "ctrl\x1cchar",
             "\uff46\uff55\uff4c\uff4c width", "cafe\u0301  na\u00efve", "\u4e2d\u6587 mixed", "a" * 300,
             "x " * 400, "emoji \U0001f389 ok", "\u00a0nbsp\u2003em", "zero\u200bwidth", "", " ", "end ",
             "kubectl get pods -n kube-system --field-selector=status.phase!=Running"]
    rng = random.Random(7)
    alphabet = "ab c\u00e9\t\n\u00a0,.!\u4e2d\u0301Zz9-'\"\x1c"
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(2000)]
    for text in texts * 2:  # the second round answers from the memo
        assert static.token_ids(text) == tokenizer.encode(text, add_special_tokens=False).ids, repr(text)
    assert len(static._chunks) <= 65_536


def req(text: str) -> CacheRequest:
    return CacheRequest(tenant="t", model="m", kind="chat",
                        body={"messages": [{"role": "user", "content": text}], "temperature": 0})


ANSWER = {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "..."}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}}


async def test_the_shipped_cache_encodes_only_when_a_candidate_needs_the_pair_model() -> None:
    cache = build_cache(CacheConfig(), kvstore=MemoryKVStore())
    assert isinstance(cache, TwoLayerCache) and isinstance(cache.prefilter, StaticMiniLM)
    await cache.warm_up()
    first = await cache.lookup(req("How do I reset my password?"))
    await cache.store(req("How do I reset my password?"), first, ANSWER)
    unrelated = await cache.lookup(req("What is a good recipe for tomato soup?"))
    assert unrelated.status == CacheStatus.MISS and unrelated.embedding is None
    same_words = await cache.lookup(req("how do i reset my password please"))  # every word matches: no encoding
    assert same_words.status == CacheStatus.HIT_SEMANTIC and same_words.state.get("vector") is None
    hit = await cache.lookup(req("I forgot my password, how do I reset it?"))  # the pair model decides
    assert hit.status == CacheStatus.HIT_SEMANTIC and hit.embedding is not None
    assert cache.metrics.prefilter.labels("skipped")._value.get() == 2
    assert cache.metrics.prefilter.labels("matched")._value.get() == 1
    assert cache.metrics.prefilter.labels("encoded")._value.get() == 1
    await cache.aclose()
