"""Lookup latency of the semantic cache with many stored entries, and where the time goes.

Setup: one partition (one tenant, model and system prompt: the worst case, every entry is a candidate)
filled with `entries` synthetic entries. Their vectors are real MiniLM embeddings of the evaluation
prompts plus Gaussian noise (`noise` x a random unit direction, renormalised), so the index sees the
clustered geometry of real prompts rather than uniform random points. Records go into the in-memory store.

Measured per query (real prompts, real MiniLM): the full `lookup()`, and separately its stages: embed
(one prompt, in a worker thread as in the gateway), vector search (HNSW, and an exact flat scan over the
same vectors as the baseline, with how often HNSW returns the exact top hit, or one within 0.01 cosine),
fetch (MGET of the top-k records) and verify. Bounded: `entries` and `queries` cap the work; progress goes
to `progress`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry

from fleetgate.cache.config import CacheConfig
from fleetgate.cache.embedding import Embedder
from fleetgate.cache.keys import cache_keys
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.pairmodel import load_model
from fleetgate.cache.sharedindex import LogEntry
from fleetgate.cache.tokenalign import NEUTRAL, TokenStates, align_features
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import CacheRequest
from fleetgate.cache.verifier import Pending, alignment, judge, precheck, verify
from fleetgate.core.kvstore import MemoryKVStore


@dataclass(slots=True)
class Timings:
    name: str
    seconds: list[float]

    def pct(self, q: float) -> float:
        return float(np.percentile(np.asarray(self.seconds), q)) * 1000.0


def _request(text: str) -> CacheRequest:
    return CacheRequest(tenant="bench", model="bench-model", kind="chat",
                        body={"messages": [{"role": "system", "content": "You are helpful."},
                                           {"role": "user", "content": text}], "temperature": 0})


async def measure(
    *, embedder: Embedder, config: CacheConfig, prompts: Sequence[str], entries: int, queries: int,
    noise: float = 0.35, seed: int = 7, progress: Callable[[str], None] = print,
) -> tuple[list[Timings], dict[str, float]]:
    rng = np.random.default_rng(seed)
    config = config.model_copy(update={"max_entries": max(config.max_entries, entries + 1)})
    kv = MemoryKVStore()
    cache = TwoLayerCache(config=config, kvstore=kv, embedder=embedder, metrics=CacheMetrics(CollectorRegistry()))
    centres = embedder.embed(list(prompts))
    partition = cache_keys(_request("x")).partition
    start = time.perf_counter()
    expires = time.time() + 3600
    record = b'{"tenant":"bench","partition":"%s","text":"synthetic","response":{}}' % partition.encode()
    for i in range(entries):
        direction = rng.standard_normal(embedder.dim).astype(np.float32)
        vector = centres[i % len(centres)] + noise * direction / np.linalg.norm(direction)
        vector /= np.linalg.norm(vector)
        key = f"synthetic-{i}"
        cache.index.apply(LogEntry(key=key, partition=partition, expires_at=expires, vector=vector))
        await kv.set(f"{config.key_prefix}x:{key}", record)
        if (i + 1) % 10_000 == 0:
            progress(f"  stored {i + 1}/{entries} entries ({time.perf_counter() - start:.1f} s)")
    build_s = time.perf_counter() - start

    import faiss

    flat = faiss.IndexFlatIP(embedder.dim)
    part = cache.index.vectors._parts[partition]
    flat.add(np.ascontiguousarray(part.vectors))
    sample = list(prompts)[:queries]
    t = {name: Timings(name, []) for name in ("lookup", "embed", "search", "search-flat", "fetch", "verify")}
    agree = near = 0
    for n, text in enumerate(sample):
        s0 = time.perf_counter()
        await cache.lookup(_request(text))
        t["lookup"].seconds.append(time.perf_counter() - s0)
        s0 = time.perf_counter()
        vector = await cache.embed(text)
        t["embed"].seconds.append(time.perf_counter() - s0)
        s0 = time.perf_counter()
        found = cache.index.vectors.search(partition=partition, vector=vector, k=config.semantic.top_k)
        t["search"].seconds.append(time.perf_counter() - s0)
        s0 = time.perf_counter()
        best_score, best = flat.search(vector.reshape(1, -1), 1)
        t["search-flat"].seconds.append(time.perf_counter() - s0)
        agree += bool(found) and found[0][0] == part.ids[int(best[0][0])]
        near += bool(found) and found[0][1] >= float(best_score[0][0]) - 0.01
        s0 = time.perf_counter()
        await kv.mget([f"{config.key_prefix}x:{key}" for key, _ in found])
        t["fetch"].seconds.append(time.perf_counter() - s0)
        s0 = time.perf_counter()
        for j, _ in enumerate(found):  # the candidates' own texts are synthetic: verify against real prompts
            verify(sample[(n + j + 1) % len(sample)], text, similarity=0.9)
        t["verify"].seconds.append(time.perf_counter() - s0)
        if (n + 1) % 50 == 0:
            progress(f"  {n + 1}/{len(sample)} queries")
    facts = {"entries": float(entries), "build_s": build_s, "hnsw_agrees_with_flat": agree / max(1, len(sample)),
             "hnsw_within_001": near / max(1, len(sample)),
             "hnsw": float(part.approximate)}
    return list(t.values()), facts


async def redis_fetch(*, url: str, records: int = 2000, size: int = 2048, k: int = 4, rounds: int = 200,
                      seed: int = 7) -> Timings:
    """MGET of `k` random records of `size` bytes out of `records`, the semantic layer's one fetch."""
    from fleetgate.core.kvstore import RedisKVStore

    rng = np.random.default_rng(seed)
    kv = RedisKVStore(url, prefix="fg-bench:")
    try:
        for i in range(records):
            await kv.set(f"r{i}", bytes(size), ttl_s=600)
        out = Timings("fetch-redis", [])
        for _ in range(rounds):
            keys = [f"r{int(i)}" for i in rng.integers(0, records, size=k)]
            s0 = time.perf_counter()
            await kv.mget(keys)
            out.seconds.append(time.perf_counter() - s0)
        return out
    finally:
        await kv.close()


def verification_cost(pairs: Sequence[tuple[str, str]], *, states: TokenStates) -> tuple[Timings, Timings]:
    """CPU time of verifying real candidate pairs as a lookup does: (the cheap stages alone, for pairs they
    settle; the whole verification, token states included, for pairs that reach the pair model). The stored
    text's token states are computed beforehand (a stored entry's are kept); the query's are not: the model
    stage includes the encoder pass a lookup pays for a query whose states its embedding pass did not give (a
    corrected misspelling, an embedder other than the int8 ONNX one); with the int8 embedder a lookup's
    query states come with its embedding."""
    cheap, model = Timings("verify-cheap", []), Timings("verify-model", [])
    uses = load_model().uses_alignment
    for stored, _ in pairs:
        step = precheck(stored, stored)
        if isinstance(step, Pending):
            alignment(step, states)
        states.words(stored)
    for stored, query in pairs:
        s0 = time.perf_counter()
        step = precheck(stored, query)
        if not isinstance(step, Pending):
            cheap.seconds.append(time.perf_counter() - s0)
            continue
        align = (align_features(states.words(stored), states.compute(query))  # the query's: a fresh pass
                 if uses else NEUTRAL)
        judge(step, similarity=0.9, align=align)
        model.seconds.append(time.perf_counter() - s0)
    return cheap, model
