"""Lookup latency of the semantic cache with many stored entries, and where the time goes.

`measure_loaded` (what `fleetgate cache-eval --entries N` runs): the shipped lookup path, the cache built as
the gateway builds it (static prefilter, encoder behind the batcher), entries carrying both vectors and a
real prompt as their text, timed one lookup at a time and under open-loop load; see its docstring.

Bounded: `entries` and `queries` cap the work; progress goes to `progress`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry

from fleetgate.cache.asymmetry import STATE_NEUTRAL, state_features
from fleetgate.cache.config import CacheConfig
from fleetgate.cache.embedding import Embedder
from fleetgate.cache.keys import cache_keys
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.pairmodel import load_model
from fleetgate.cache.sharedindex import LogEntry
from fleetgate.cache.tokenalign import TokenStates
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import CacheRequest, CacheStatus
from fleetgate.cache.verifier import Pending, alignment, judge, judge_without_alignment, precheck
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


def verification_cost(pairs: Sequence[tuple[str, str, float]], *,
                      states: TokenStates) -> tuple[Timings, Timings, Timings]:
    """CPU time of verifying real candidate pairs (stored, query, similarity) as a lookup does: the cheap
    stages alone, for pairs they settle; the pair model without token states, for pairs its bound settles
    (`verifier.judge_without_alignment`); and with them, for the rest. The stored text's token states are
    computed beforehand (a stored entry's are kept); the query's are not: that stage includes the encoder
    pass a lookup pays for a query whose states its embedding pass did not give (a corrected misspelling, an
    embedder other than the int8 ONNX one); with the int8 embedder a lookup's query states come with its
    embedding."""
    cheap, bound, model = Timings("verify-cheap", []), Timings("verify-bound", []), Timings("verify-states", [])
    uses = load_model().uses_alignment
    for stored, _, _ in pairs:
        step = precheck(stored, stored)
        if isinstance(step, Pending):
            alignment(step, states)
        states.words(stored)
    for stored, query, similarity in pairs:
        s0 = time.perf_counter()
        step = precheck(stored, query)
        if not isinstance(step, Pending):
            cheap.seconds.append(time.perf_counter() - s0)
            continue
        if uses and judge_without_alignment(step, similarity=similarity) is not None:
            bound.seconds.append(time.perf_counter() - s0)
            continue
        align = (state_features(states.words(stored), states.compute(query),  # the query's: a fresh pass
                                head=load_model().head) if uses else STATE_NEUTRAL)
        judge(step, similarity=similarity, align=align)
        model.seconds.append(time.perf_counter() - s0)
    return cheap, bound, model


# -- the shipped lookup path under load --------------------------------------------------------------------

STAGES = ("static", "sync", "prefilter", "embed", "search", "fetch", "align", "verify")
_ANSWER = ("Here is a step-by-step answer. " * 24).strip()  # ~750 characters: a short chat answer


@dataclass(slots=True)
class Level:
    """One load level: `name` ("single stream", "50%", ...), the arrival rate asked (0: closed loop, one
    lookup at a time) and achieved, each lookup's latency from its arrival to its answer, the per-stage
    times the cache observed (its `stage_seconds` metric), and what the lookups did."""

    name: str
    rate: float
    achieved: float
    lookup: Timings
    stages: dict[str, Timings]
    encoded_lookup: Timings  # the lookups that encoded, and those the prefilter settled without the encoder
    skipped_lookup: Timings
    encoded: int
    hits: int
    max_in_flight: int
    token_passes: int = 0  # encoder passes for the verifier's token states (texts not in its memo)

    @property
    def lookups(self) -> int:
        return len(self.lookup.seconds)


@dataclass(slots=True)
class LoadedRun:
    entries: int
    build_s: float
    stored_texts: int
    levels: list[Level]
    facts: dict[str, float]


class _StageRecorder:
    """Wraps `CacheMetrics.at` so every `stage_seconds` observation is also kept, per stage, in `into`."""

    def __init__(self, metrics: CacheMetrics) -> None:
        self.into: dict[str, list[float]] = {}
        self._metrics = metrics
        self._at = metrics.at

    def __call__(self, metric: object, *values: str) -> object:
        child = self._at(metric, *values)
        if metric is not self._metrics.stage_seconds:
            return child
        seen = self.into.setdefault(values[0], [])

        class _Observed:
            @staticmethod
            def observe(seconds: float) -> None:
                seen.append(seconds)
                child.observe(seconds)

        return _Observed


def _record(partition: str, text: str) -> bytes:
    import orjson

    return orjson.dumps({"tenant": "bench", "partition": partition, "text": text, "stored_at": time.time(),
                         "response": {"id": "chatcmpl-bench", "object": "chat.completion", "created": 1,
                                      "model": "bench-model",
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": _ANSWER}}],
                                      "usage": {"prompt_tokens": 20, "completion_tokens": 160,
                                                "total_tokens": 180}}})


def _noisy(rng: np.random.Generator, centre: np.ndarray, noise: float) -> np.ndarray:
    direction = rng.standard_normal(len(centre)).astype(np.float32)
    vector = centre + noise * direction / np.linalg.norm(direction)
    return (vector / np.linalg.norm(vector)).astype(np.float32)


async def measure_loaded(
    *, embedder: Embedder, prefilter: Embedder | None, config: CacheConfig, prompts: Sequence[str], entries: int,
    queries: int, loads: Sequence[float] = (0.5, 0.9), noise: float = 0.35, seed: int = 7,
    vectors: Embedder | None = None, static_vectors: Embedder | None = None,
    progress: Callable[[str], None] = print,
) -> LoadedRun:
    """The lookup path the gateway runs, at `entries` entries, one lookup at a time and then under load.

    The cache is built as `fleetgate.cache.build.build_cache` builds it: `embedder` is the cache's encoder
    (the gateway's is a `BatchingEmbedder`: lookups encode through its `aembed`), `prefilter` its static
    embedder (None: `semantic.prefilter: off`). `prompts` are split at random: `queries` x (1 + len(loads))
    of them are looked up (a fresh slice per level, so no level finds the text caches warmed by another),
    the rest are stored. Entry i is derived from stored prompt i mod n: its encoder vector is the encoder's
    vector of the prompt plus `noise` x a random unit direction, renormalised; its static vector likewise
    in the static space; its record's `text` is the prompt itself (so the verifier's text checks run on real
    text) and its response a ~1 kB chat answer. Vectors are those of `embedding_text(prompt)`, as a lookup
    computes them (`vectors` / `static_vectors`: memoised embedders giving the same vectors, to skip
    re-encoding the prompts; default the cache's own).

    Load. Level "single stream": `queries` lookups one after another (closed loop, concurrency 1); its
    throughput is the capacity. Each level in `loads` (a share of that capacity): `queries` lookups arriving
    open loop, Poisson at share x capacity per second, each a task of its own on the one event loop (as
    concurrent gateway requests are), whatever is still in flight; a lookup's latency runs from its
    scheduled arrival to its answer, so time spent queued behind others counts. Nothing else of the gateway
    runs: the load is cache lookups only.
    """
    from fleetgate.cache.textnorm import embedding_text

    if entries < 1 or queries < 1:
        raise ValueError("entries and queries must be >= 1")
    rng = np.random.default_rng(seed)
    pool = sorted({p for p in prompts if p.strip()})
    rng.shuffle(pool)
    wanted = queries * (1 + len(loads))
    if len(pool) < wanted + 1:
        raise ValueError(f"{len(pool)} distinct prompts: need more than {wanted} ({queries} per level)")
    asked, stored = pool[:wanted], pool[wanted:]

    config = config.model_copy(update={"max_entries": max(config.max_entries, entries + 1)})
    kv = MemoryKVStore()
    cache = TwoLayerCache(config=config, kvstore=kv, embedder=embedder, prefilter=prefilter,
                          metrics=CacheMetrics(CollectorRegistry()))
    recorder = _StageRecorder(cache.metrics)
    cache.metrics.at = recorder  # type: ignore[method-assign]
    start = time.perf_counter()
    progress(f"  loading the models and embedding {len(stored)} stored prompts")
    await cache.warm_up()
    seen = [embedding_text(p) for p in stored]
    centres = (vectors or embedder).embed(seen)
    statics = (static_vectors or prefilter).embed(seen) if prefilter is not None else None
    progress(f"  models and {len(stored)} prompts embedded ({time.perf_counter() - start:.1f} s)")
    partition = cache_keys(_request("x")).partition
    expires = time.time() + 3600
    start = time.perf_counter()
    for i in range(entries):
        j = i % len(stored)
        key = f"synthetic-{i}"
        cache.index.apply(LogEntry(key=key, partition=partition, expires_at=expires,
                                   vector=_noisy(rng, centres[j], noise),
                                   static=None if statics is None else _noisy(rng, statics[j], noise)))
        await kv.set(f"{config.key_prefix}x:{key}", _record(partition, stored[j]))
        if (i + 1) % 10_000 == 0:
            progress(f"  stored {i + 1}/{entries} entries ({time.perf_counter() - start:.1f} s)")
    build_s = time.perf_counter() - start
    facts = _index_facts(cache, partition, asked[:queries], prefilter, vectors or embedder, static_vectors,
                         text_of=lambda key: stored[int(key.rsplit("-", 1)[1]) % len(stored)])

    levels: list[Level] = []
    slices = [asked[n * queries:(n + 1) * queries] for n in range(1 + len(loads))]
    level = await _run_level(cache, recorder, slices[0], name="single stream", rate=0.0, rng=rng)
    levels.append(level)
    progress(f"  single stream: {level.achieved:.1f} lookups/s, p50 {level.lookup.pct(50):.2f} ms, "
             f"p99 {level.lookup.pct(99):.2f} ms")
    capacity = level.achieved
    for share, texts in zip(loads, slices[1:], strict=True):
        level = await _run_level(cache, recorder, texts, name=f"{100 * share:.0f}%", rate=share * capacity, rng=rng)
        levels.append(level)
        progress(f"  {level.name} of capacity ({level.rate:.1f}/s): p50 {level.lookup.pct(50):.2f} ms, "
                 f"p99 {level.lookup.pct(99):.2f} ms")
    return LoadedRun(entries=entries, build_s=build_s, stored_texts=len(stored), levels=levels, facts=facts)


def _token_passes(cache: TwoLayerCache) -> int:
    """The verifier's own token-state encoder passes so far (texts no embedding pass handed over)."""
    return cache.token_states.passes if cache.token_states is not None else 0


async def _run_level(cache: TwoLayerCache, recorder: _StageRecorder, texts: Sequence[str], *,
                     name: str, rate: float, rng: np.random.Generator) -> Level:
    import asyncio

    recorder.into = {}
    passes_before = _token_passes(cache)
    lookup, encoded, skipped = Timings("lookup", []), Timings("encoded", []), Timings("skipped", [])
    counts = {"hits": 0, "in_flight": 0, "max_in_flight": 0}

    async def one(text: str, arrival: float) -> None:
        counts["in_flight"] += 1
        counts["max_in_flight"] = max(counts["max_in_flight"], counts["in_flight"])
        result = await cache.lookup(_request(text))
        took = time.perf_counter() - arrival
        lookup.seconds.append(took)
        counts["in_flight"] -= 1
        (encoded if result.state.get("vector") is not None else skipped).seconds.append(took)
        counts["hits"] += result.status == CacheStatus.HIT_SEMANTIC

    t0 = time.perf_counter()
    if rate <= 0:
        for text in texts:
            await one(text, time.perf_counter())
    else:
        arrivals = t0 + np.cumsum(rng.exponential(1.0 / rate, len(texts)))
        tasks = []
        for text, arrival in zip(texts, arrivals, strict=True):
            delay = float(arrival) - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(text, float(arrival))))
        await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    stages = {stage: Timings(stage, list(recorder.into[stage])) for stage in STAGES if recorder.into.get(stage)}
    return Level(name=name, rate=rate, achieved=len(texts) / elapsed, lookup=lookup, stages=stages,
                 encoded_lookup=encoded, skipped_lookup=skipped, encoded=len(encoded.seconds), hits=counts["hits"],
                 max_in_flight=counts["max_in_flight"],
                 token_passes=_token_passes(cache) - passes_before)


def _index_facts(cache: TwoLayerCache, partition: str, texts: Sequence[str], prefilter: Embedder | None,
                 encoder: Embedder, static_vectors: Embedder | None,
                 text_of: Callable[[str], str]) -> dict[str, float]:
    """Both indexes' search at this size against an exact flat scan of the same vectors: kind (1: IVF),
    p50/p99 ms of each, and recall (the share of the flat scan's top k that the index returns, k as a lookup
    asks: `top_k` for the encoder's, `prefilter_k` for the static one), by entry and by entry text (the flat
    top k's distinct texts that the index returns an entry of: the text checks see the same texts)."""
    import faiss

    from fleetgate.cache.textnorm import embedding_text

    sem = cache.config.semantic
    seen = [embedding_text(t) for t in texts]
    out: dict[str, float] = {}
    spaces = [("encoder", cache.index.vectors, encoder.embed(seen), sem.top_k)]
    if prefilter is not None and cache.index.static is not None:
        spaces.append(("static", cache.index.static, (static_vectors or prefilter).embed(seen), sem.prefilter_k))
    for name, index, queries, k in spaces:
        ids, vectors = index.live_vectors(partition)
        approximate = float(index._parts[partition].approximate)
        flat = faiss.IndexFlatIP(index.dim)
        flat.add(np.ascontiguousarray(vectors))
        searched, exact = Timings("index", []), Timings("flat", [])
        found = found_texts = want_texts = 0
        for query in queries:
            s0 = time.perf_counter()
            got = index.search(partition=partition, vector=query, k=k)
            searched.seconds.append(time.perf_counter() - s0)
            s0 = time.perf_counter()
            _, best = flat.search(query.reshape(1, -1).astype(np.float32), k)
            exact.seconds.append(time.perf_counter() - s0)
            truth = {ids[int(i)] for i in best[0] if i >= 0}
            found += len({key for key, _ in got} & truth)
            want = {text_of(key) for key in truth}
            want_texts += len(want)
            found_texts += len(want & {text_of(key) for key, _ in got})
        out |= {f"{name}_ann": approximate, f"{name}_p50": searched.pct(50), f"{name}_p99": searched.pct(99),
                f"{name}_flat_p50": exact.pct(50), f"{name}_flat_p99": exact.pct(99),
                f"{name}_recall": found / max(1, k * len(queries)),
                f"{name}_text_recall": found_texts / max(1, want_texts)}
    return out
