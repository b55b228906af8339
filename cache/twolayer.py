"""`TwoLayerCache`: the exact layer first, the semantic layer second, one shared store underneath.

lookup(req):
1. keys (`fleetgate.cache.keys`) and policy (`fleetgate.cache.policy`): bypass or no-cache decided first;
2. exact: GET `{prefix}x:{exact}`; a record whose tenant and partition equal the request's is a hit;
3. semantic (chat, plain-text last user message): embed the last message in a worker thread, replay the
   shared log if the index is older than `sync_interval_s`, search the request's partition for `top_k`
   neighbours with cosine >= `threshold`, fetch them in one MGET and serve the first (most similar) one
   whose record matches tenant and partition and that the near-miss verifier accepts; when the pair model
   accepted it (a would-be hit, not a word match), the pair veto (`semantic.pair_veto`,
   `fleetgate.cache.pairveto`) must not refuse it: a refused candidate is passed over like a rejected one, and
   a veto that is not loaded yet (a serving cache loads it in the background on the first would-be hit) or
   failed to load makes the lookup a miss.
   With the static prefilter (`semantic.prefilter`, on with MiniLM; `fleetgate.cache.prefilter`) the
   encoder comes last: the static vector (microseconds) finds the `prefilter_k` nearest entries, their
   records are fetched and the verifier's text checks run on them; when every one is vetoed (or there is
   none) the lookup is a miss without encoding, which the encoder could not have changed (a vetoed pair is
   rejected at any similarity). When a survivor's every word matched the prompt's (`wordmatch.full_match`),
   it is served without encoding (`StaticPrefilter.matched`). Otherwise the prompt is encoded, the encoder's
   own `top_k` neighbours join the survivors (a survivor stored without the encoder's vector gets it now;
   `top_k` of them, most similar first, are verified) and step 3 goes on as above.
A hit returns the stored response with a fresh `id` and `created`; its `usage` is the original one (the
tokens the cache saved).

store(req, lookup, response): only when the policy allowed storing and the response is a complete
success (`policy.storable`); writes the record with the TTL, appends the log entry, indexes it locally
and evicts past `max_entries`.

Fail open: any store error turns the lookup into a `bypass` ("cache backend unavailable") and the store
into a no-op; `StoreUnavailableError` additionally marks the backend down (gauge, one warning log line).
While down, lookups answer `bypass` at once and a background task pings the store at most every
`backend_retry_s`; once it answers, the index is rebuilt from the log (the store may have restarted
empty) and caching resumes.

Warm-up: the embedder and the verifier's word tables load in a thread on the first request that reaches the
semantic layer (at start-up with `semantic.preload`); until they are loaded, semantic lookups answer `miss`
("semantic layer warming up") instead of holding requests for a second or more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fleetgate.cache.answercheck import AnswerChecker, Ask
from fleetgate.cache.asymmetry import STATE_NEUTRAL
from fleetgate.cache.config import CacheConfig
from fleetgate.cache.embedding import Embedder, encoder_of, serves_minilm
from fleetgate.cache.encoder_call import encode
from fleetgate.cache.keys import CacheKeys, cache_keys, follows_user_turns, owns
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.pairmodel import load_model
from fleetgate.cache.pairveto import PairScorer, PairVeto, default_scorer
from fleetgate.cache.policy import Decision, decide, storable
from fleetgate.cache.prefilter import StaticPrefilter, Survivors
from fleetgate.cache.remote_encoder import EncoderUnavailable
from fleetgate.cache.served import served_response
from fleetgate.cache.sharedindex import LogEntry, SharedIndex
from fleetgate.cache.store_health import StoreHealth
from fleetgate.cache.textnorm import embedding_text
from fleetgate.cache.types import CacheLookup, CacheRequest, CacheStatus
from fleetgate.cache.verifier import (
    Pending,
    Verdict,
    alignment,
    default_states,
    judge,
    judge_without_alignment,
    precheck,
    warm_up,
)
from fleetgate.core.kvstore import KVStore, MemoryKVStore

log = logging.getLogger("fleetgate.cache")
_DOWN = "cache backend unavailable"


class TwoLayerCache:
    def __init__(
        self, *, config: CacheConfig, kvstore: KVStore, metrics: CacheMetrics, embedder: Embedder | None,
        prefilter: Embedder | None = None, pair_veto: PairScorer | None = None,
    ) -> None:
        self.config = config
        self.kv = kvstore
        self.metrics = metrics
        self.embedder = embedder if config.semantic.enabled else None
        sem = config.semantic
        # the static embedder of the prefilter (`fleetgate.core.minilm_static` for MiniLM; None: encode always)
        self.prefilter = prefilter if self.embedder is not None and sem.prefilter == "static" else None
        self.index = SharedIndex(
            dim=embedder.dim if embedder else 1, max_entries=config.max_entries, ann_above=sem.ann_above,
            ann_lists=sem.ann_lists, ann_probe=sem.ann_probe,
            static_dim=self.prefilter.dim if self.prefilter is not None else None,
        )
        self._prefilter: StaticPrefilter | None = None
        if self.prefilter is not None and self.index.static is not None:
            self._prefilter = StaticPrefilter(embedder=self.prefilter, index=self.index.static, kv=kvstore,
                                              metrics=metrics, config=sem, record_key=self._key,
                                              forget=self.index.remove)
        self._log = f"{config.key_prefix}log"
        self._log_max_len = config.log_max_len or 2 * config.max_entries
        self._sync_lock = asyncio.Lock()
        self.health = StoreHealth(kv=kvstore, retry_s=config.backend_retry_s, metrics=metrics,
                                  on_back=lambda: self.index.reset())
        self._warming: asyncio.Task[Any] | None = None
        self._background_warm_up = False  # set by start(): load models in a thread, answer `miss` meanwhile
        self._replicated = not isinstance(kvstore, MemoryKVStore)
        # MiniLM token states for the pair model's alignment features (loaded on first use, shared per process);
        # none with the tests' hashing embedder, whose caches must not load a model (neutral alignment)
        self.answer_check = (AnswerChecker(config=sem.answer_check, metrics=metrics.answer_check,
                                           embed=self._embed_answers, evict=self.evict)
                             if sem.answer_check is not None and self.embedder is not None else None)
        self.token_states = (None if sem.embedder == "hashing"
                             else default_states(Path(sem.model_dir) if sem.model_dir else None))
        if (self.token_states is not None and self.embedder is not None and sem.verify
                and load_model().uses_alignment):
            # the int8 ONNX encoder's pass that embeds a text also gives its token states (one pass and one
            # session, not two); any other embedder leaves `TokenStates` its own session and passes
            self.token_states.share(encoder_of(self.embedder))
        # the cross-encoder on would-be hits (`pair_veto` given: tests; else the shipped one, shared per process,
        # with a MiniLM encoder; none with another one, the tests' hashing embedder: no MiniLM there)
        scorer = pair_veto if pair_veto is not None else (
            default_scorer(Path(sem.model_dir) if sem.model_dir else None)
            if self.embedder is not None and serves_minilm(encoder_of(self.embedder)) else None)
        self.veto = (PairVeto(scorer, threshold=sem.pair_veto.threshold, metrics=self.metrics)
                     if sem.pair_veto.enabled and sem.verify and self.embedder is not None and scorer is not None
                     else None)

    async def start(self) -> None:
        """Gateway lifespan hook. With `semantic.preload` the embedder and the verifier's word tables load now,
        in a thread, without holding up start-up; otherwise on the first request that reaches the semantic
        layer, so a gateway whose cache is bypassed never holds them (the word tables alone are ~200 MB)."""
        self._background_warm_up = True
        if self.config.semantic.preload:
            self._warm()

    async def warm_up(self) -> None:
        """Load the semantic layer's models now and wait for them (benchmarks, tests, eager callers)."""
        self._warm()
        if self._warming is not None:
            await asyncio.shield(self._warming)

    def _warm(self) -> None:
        if self.embedder is not None and self._warming is None:
            self._warming = asyncio.create_task(asyncio.to_thread(self._load_models), name="cache-models-load")

    def _load_models(self) -> None:
        for model in (self.prefilter, self.embedder):
            load = getattr(model, "load", None)
            if load is not None:
                load()
        if self.veto is not None and self.config.semantic.preload:  # else: on the first would-be hit
            self.veto.preload()
        if self.config.semantic.verify:
            # word frequency lists of seven languages and the token states (a session of their own unless
            # they share the embedder's): seconds otherwise
            warm_up(states=self.token_states)

    async def aclose(self) -> None:
        if self.answer_check is not None:
            await self.answer_check.aclose()
        for task in (self._warming, self.health.probe, self.veto.loading if self.veto is not None else None):
            if task is not None and not task.done():
                with contextlib.suppress(BaseException):
                    await task
        close = getattr(self.embedder, "aclose", None)  # the batcher's worker, an encoder service's connections
        if close is not None:
            await close()

    def _still_warming(self) -> bool:
        return self._warming is not None and not self._warming.done()

    def _key(self, exact: str) -> str:
        return f"{self.config.key_prefix}x:{exact}"

    async def sync(self, *, force: bool = False) -> None:
        """Replay the shared log into the local index (at most every `sync_interval_s` unless forced).

        An in-process `MemoryKVStore` has one writer, this cache, whose stores are indexed as they happen:
        its log is replayed only when forced (scanning it grows with its length)."""
        if not force and not self._replicated:
            return
        if not force and time.monotonic() - self.index.last_sync < self.config.semantic.sync_interval_s:
            return
        if self._sync_lock.locked() and not force:
            return  # another lookup is replaying; a slightly stale index is fine
        async with self._sync_lock:
            while True:
                rows = await self.kv.log_read(self._log, after=self.index.cursor, count=1000)
                for entry_id, raw in rows:
                    self.index.cursor = entry_id
                    try:
                        entry = LogEntry.decode(raw)
                    except (ValueError, KeyError, TypeError) as exc:
                        # a line this version cannot read (another version's, or damaged) is skipped, not
                        # retried forever: otherwise every later sync, and so every semantic lookup, fails on it
                        self.metrics.backend_errors.inc()
                        log.warning("response cache: skipped an unreadable log line %s: %s", entry_id, exc)
                        continue
                    self.metrics.evictions.inc(len(self.index.apply(entry)))
                if len(rows) < 1000:
                    break
            self.index.drop_expired()
            self.index.last_sync = time.monotonic()
            self._update_gauges()

    def _update_gauges(self) -> None:
        self.metrics.entries.labels("all").set(len(self.index))
        vectors = self.index.static if self.index.static is not None else self.index.vectors
        self.metrics.entries.labels("semantic").set(len(vectors))

    # -- lookup ---------------------------------------------------------------------------------------
    async def lookup(self, req: CacheRequest) -> CacheLookup:
        keys = cache_keys(req)
        decision = decide(req, self.config, semantic_text=keys.semantic_text)
        state: dict[str, Any] = {"keys": keys, "decision": decision}
        if not decision.serve and not decision.store:
            self.metrics.at(self.metrics.lookups, "none", "bypass").inc()
            return CacheLookup(status=CacheStatus.BYPASS, reason=decision.reason, state=state)
        try:
            if not await self.health.available():
                self.metrics.at(self.metrics.lookups, "none", "bypass").inc()
                return CacheLookup(status=CacheStatus.BYPASS, reason=_DOWN)
            if not decision.serve:
                self.metrics.at(self.metrics.lookups, "none", "bypass").inc()
                return CacheLookup(status=CacheStatus.BYPASS, reason=decision.reason, state=state)
            hit = await self._exact(req, keys)
            if hit is not None:
                return hit
            if decision.semantic and self.embedder is not None:
                if self._background_warm_up:  # a started (serving) cache; offline users load on first use
                    self._warm()
                if self._still_warming():  # the models load in the background (about a second)
                    self.metrics.at(self.metrics.lookups, "semantic", "bypass").inc()
                    return CacheLookup(status=CacheStatus.MISS, reason="semantic layer warming up", state=state)
                return await self._semantic(req, keys, state)
            return CacheLookup(status=CacheStatus.MISS, reason="no exact match", state=state)
        except Exception as exc:
            self.health.failed(exc, op="lookup")
            self.metrics.at(self.metrics.lookups, "none", "error").inc()
            return CacheLookup(status=CacheStatus.BYPASS, reason=_DOWN)

    async def _exact(self, req: CacheRequest, keys: CacheKeys) -> CacheLookup | None:
        start = time.perf_counter()
        raw = await self.kv.get(self._key(keys.exact))
        self.metrics.at(self.metrics.lookup_seconds, "exact").observe(time.perf_counter() - start)
        record = orjson.loads(raw) if raw else None
        if record is None or not owns(record, req, keys):
            self.metrics.at(self.metrics.lookups, "exact", "miss").inc()
            return None
        self.metrics.at(self.metrics.lookups, "exact", "hit").inc()
        return CacheLookup(status=CacheStatus.HIT_EXACT, response=served_response(record, kind=req.kind))

    async def embed(self, text: str, *, scope: str = "") -> np.ndarray:
        """`scope`: the partition, which keeps the batcher's embedding memo per tenant (no timing side channel).
        Misspellings are corrected first: "revrese a lsit" is embedded as "reverse a list"."""
        return await self._encode(embedding_text(text), scope=scope)

    async def _encode(self, seen: str, *, scope: str) -> np.ndarray:
        """The encoder's vector of a text already spelling-corrected (`embedding_text`); `EncoderUnavailable`
        when the encoder fails or does not answer within its bound (an encoder service's `timeout_ms`)."""
        assert self.embedder is not None
        return await encode(self.embedder, seen, scope=scope,
                            observe=self.metrics.at(self.metrics.stage_seconds, "embed").observe)

    def _without_encoder(self, result: CacheLookup, start: float, exc: EncoderUnavailable) -> CacheLookup:
        """The lookup goes on without the encoder: what the static prefilter settled before it (vetoes, full
        word matches) stands, anything else is a miss. A request never fails or waits for a broken encoder."""
        self.metrics.at(self.metrics.encoder.fallbacks, exc.reason).inc()
        if exc.reason not in ("circuit_open", "no_endpoint"):  # those repeat for every lookup of an outage
            log.debug("semantic lookup without the encoder: %s", exc)
        result.reason = f"encoder unavailable ({exc.reason})"
        return self._done(result, start, found=False)

    async def _semantic(self, req: CacheRequest, keys: CacheKeys, state: dict[str, Any]) -> CacheLookup:
        sem = self.config.semantic
        text = keys.semantic_text
        assert text is not None
        start = time.perf_counter()
        result = CacheLookup(status=CacheStatus.MISS, reason="no similar entry", state=state)
        seen = embedding_text(text)  # what the encoder and the static table see: misspellings corrected
        survivors: Survivors = {}
        if self._prefilter is not None:
            state["static"] = self._prefilter.vector(seen)
            self.metrics.at(self.metrics.stage_seconds, "static").observe(time.perf_counter() - start)
            await self._timed_sync()
            survivors = await self._prefilter.survivors(req, keys, state["static"], result)
            if not survivors:
                self.metrics.at(self.metrics.prefilter, "skipped").inc()
                return self._done(result, start, found=result.reason != "no similar entry")
            matched = StaticPrefilter.matched(survivors) if self.answer_check is None else None
            if matched is not None:
                self.metrics.at(self.metrics.prefilter, "matched").inc()
                state["entry"] = matched
                result = CacheLookup(status=CacheStatus.HIT_SEMANTIC, state=state,
                                     response=served_response(survivors[matched][0], kind=req.kind))
                return self._done(result, start, found=True)
            self.metrics.at(self.metrics.prefilter, "encoded").inc()
        try:
            vector = await self._encode(seen, scope=keys.partition)
        except EncoderUnavailable as exc:
            return self._without_encoder(result, start, exc)
        state["vector"] = vector
        # handed to the tier router only when it is the vector of the text as written: a spelling-corrected
        # text's vector is not what the router's scorer was trained on (it embeds the raw text itself then)
        shared = vector if seen == text else None
        result.embedding = shared
        if self._prefilter is None:
            await self._timed_sync()
        t = time.perf_counter()
        found = [c for c in self.index.vectors.search(partition=keys.partition, vector=vector, k=sem.top_k)
                 if c[1] >= sem.threshold]
        if survivors:
            try:
                found = await self._with_survivors(found, survivors, vector, keys)
            except EncoderUnavailable as exc:
                return self._without_encoder(result, start, exc)
        t, t_prev = time.perf_counter(), t
        self.metrics.at(self.metrics.stage_seconds, "search").observe(t - t_prev)
        todo = [key for key, _ in found if key not in survivors]
        fetched = dict(zip(todo, await self.kv.mget([self._key(key) for key in todo]) if todo else [], strict=True))
        t, t_prev = time.perf_counter(), t
        self.metrics.at(self.metrics.stage_seconds, "fetch").observe(t - t_prev)
        for key, score in found:
            if key in survivors:
                record, step = survivors[key]
            else:
                raw = fetched.get(key)
                if raw is None:
                    self.index.remove(key)  # expired or evicted elsewhere
                    continue
                record, step = orjson.loads(raw), None
                if not owns(record, req, keys):
                    continue
            if self.answer_check is not None and score < self.answer_check.bar(key):
                result.reason = f"below the answer-checked bar (similarity {score:.3f})"
                continue
            verdict = (await self._verify(str(record.get("text", "")), text, similarity=score,
                                          conversation=follows_user_turns(req.body.get("messages")), step=step)
                       if sem.verify else None)
            if verdict is not None and not verdict.ok:
                self.metrics.at(self.metrics.rejections, verdict.reason).inc()
                result.reason = f"near miss rejected ({verdict.reason}, similarity {score:.3f})"
                continue
            if verdict is not None and verdict.confidence is not None and self.veto is not None:
                refused, go_on = await self.veto.judge(str(record.get("text", "")), text,
                                                       background=self._background_warm_up)
                if refused is not None:
                    result.reason = f"{refused}, similarity {score:.3f}"
                    if go_on:
                        continue
                    break
            state["entry"] = key
            result = CacheLookup(status=CacheStatus.HIT_SEMANTIC, response=served_response(record, kind=req.kind),
                                 similarity=round(score, 4), state=state, embedding=shared)
            break
        self.metrics.at(self.metrics.stage_seconds, "verify").observe(time.perf_counter() - t)
        return self._done(result, start, found=bool(found))

    def _done(self, result: CacheLookup, start: float, *, found: bool) -> CacheLookup:
        self.metrics.at(self.metrics.lookup_seconds, "semantic").observe(time.perf_counter() - start)
        outcome = {CacheStatus.HIT_SEMANTIC: "hit"}.get(result.status, "rejected" if found else "miss")
        self.metrics.at(self.metrics.lookups, "semantic", outcome).inc()
        return result

    async def _timed_sync(self) -> None:
        t = time.perf_counter()
        await self.sync()
        self.metrics.at(self.metrics.stage_seconds, "sync").observe(time.perf_counter() - t)

    async def _with_survivors(self, found: list[tuple[str, float]], survivors: Survivors,
                              vector: np.ndarray, keys: CacheKeys) -> list[tuple[str, float]]:
        """The encoder's candidates plus the prefilter's survivors scored by the encoder (a survivor stored
        without the encoder's vector is encoded now and keeps it), most similar first, >= `threshold`, at most
        `top_k` of them: the candidates a lookup verifies are the encoder's `top_k` most similar, as without
        the prefilter. Verifying every survivor too cost one token-state pass per new candidate text, up to 12
        per lookup among near-duplicates (31.8 ms of CPU a lookup in `bench gateway`'s varied misses)."""
        have = {key for key, _ in found}
        missing = [key for key in survivors if key not in have and self.index.vectors.vector(key) is None]
        computed = await asyncio.gather(*(self._encode(embedding_text(str(survivors[key][0].get("text", ""))),
                                                       scope=keys.partition) for key in missing))
        for key, encoded in zip(missing, computed, strict=True):
            self.index.add_vector(key, encoded)
        merged = dict(found)
        for key in survivors:
            if key not in merged:
                stored = self.index.vectors.vector(key)
                score = float(np.dot(stored, vector)) if stored is not None else -1.0
                if score >= self.config.semantic.threshold:
                    merged[key] = score
        return sorted(merged.items(), key=lambda item: -item[1])[: self.config.semantic.top_k]

    async def _verify(self, cached: str, text: str, *, similarity: float, conversation: bool,
                      step: Pending | Verdict | None = None) -> Verdict:
        """Vetoes, word match and the pair model on the event loop; when the shipped model uses token
        alignment, its token states in a worker thread, only for a candidate that gets that far (grouped into
        words from the states the embedding pass of that text gave; an encoder pass of its own only for a
        text embedded in another spelling, or not embedded by this process lately). `step`: the text checks'
        outcome when the prefilter already ran them."""
        step = step if step is not None else precheck(cached, text)
        if isinstance(step, Verdict):
            return step
        align = STATE_NEUTRAL
        if self.token_states is not None and load_model().uses_alignment:
            known = judge_without_alignment(step, similarity=similarity, conversation=conversation,
                                            min_confidence=self.config.semantic.min_confidence)
            if known is not None:  # no token alignment could change the verdict: no encoder pass for it
                return known
            t = time.perf_counter()
            align = await asyncio.to_thread(alignment, step, self.token_states)
            self.metrics.at(self.metrics.stage_seconds, "align").observe(time.perf_counter() - t)
        return judge(step, similarity=similarity, align=align, conversation=conversation,
                      min_confidence=self.config.semantic.min_confidence)

    # -- answer checks (vCache-style; off unless semantic.answer_check is set) --------------------------
    def check_hit(self, req: CacheRequest, lookup: CacheLookup, *, ask: Ask, busy: Callable[[], bool] = lambda: False,
                  budget_left: Callable[[], bool] = lambda: True) -> asyncio.Task[None] | None:
        """After a semantic hit was served: maybe (sampled) ask the engine in the background via `ask` and
        learn from the answer (`fleetgate.cache.answercheck`). Only greedy requests (temperature 0) qualify.
        Returns the check's task, or None when nothing was started."""
        if self.answer_check is None or lookup.status != CacheStatus.HIT_SEMANTIC or lookup.response is None:
            return None
        greedy = req.body.get("temperature") == 0
        if not self.answer_check.sample(greedy=greedy):
            return None
        choices = lookup.response.get("choices") or [{}]
        cached = choices[0].get("message", {}).get("content") or choices[0].get("text") or ""
        return self.answer_check.start(key=str(lookup.state.get("entry")), similarity=float(lookup.similarity or 0),
                                       cached=str(cached), ask=ask, busy=busy, budget_left=budget_left)

    async def _embed_answers(self, texts: Sequence[str]) -> np.ndarray:
        assert self.embedder is not None
        return await asyncio.to_thread(self.embedder.embed, list(texts))

    async def evict(self, key: str) -> None:
        """Remove one entry (its record; the index forgets it here, other replicas on their next fetch)."""
        self.index.remove(key)
        await self.kv.delete(self._key(key))
        self._update_gauges()

    # -- store ----------------------------------------------------------------------------------------
    async def store(self, req: CacheRequest, lookup: CacheLookup, response: Mapping[str, Any]) -> None:
        keys: CacheKeys | None = lookup.state.get("keys")
        decision: Decision | None = lookup.state.get("decision")
        if keys is None or decision is None or not decision.store or not self.health.up:
            self.metrics.at(self.metrics.stores, "not allowed").inc()
            return
        why = storable(response, self.config)
        if why:
            self.metrics.at(self.metrics.stores, why.split(" ")[0]).inc()
            return
        record = orjson.dumps({"tenant": req.tenant, "partition": keys.partition, "text": keys.semantic_text,
                               "response": response, "stored_at": time.time()})
        if len(record) > self.config.max_response_bytes:
            self.metrics.at(self.metrics.stores, "too large").inc()
            return
        try:
            vector: np.ndarray | None = None
            static: np.ndarray | None = None
            if decision.semantic and self.embedder is not None and keys.semantic_text is not None:
                vector, static = lookup.state.get("vector"), lookup.state.get("static")
                if vector is None and static is None:  # the lookup did not get that far (warming up)
                    if self._warming is not None:
                        await asyncio.shield(self._warming)  # stores run after the response: waiting is fine
                    if self._prefilter is not None:
                        static = self._prefilter.vector(embedding_text(keys.semantic_text))
                    else:
                        with contextlib.suppress(EncoderUnavailable):  # then stored for exact hits only
                            vector = await self._encode(embedding_text(keys.semantic_text), scope=keys.partition)
            entry = LogEntry(key=keys.exact, partition=keys.partition,
                             expires_at=time.time() + self.config.ttl_s, vector=vector, static=static)
            await self.kv.set(self._key(keys.exact), record, ttl_s=self.config.ttl_s)
            await self.kv.log_append(self._log, entry.encode(), max_len=self._log_max_len)
            for key in self.index.apply(entry):
                await self.kv.delete(self._key(key))
                self.metrics.evictions.inc()
            self._update_gauges()
            self.metrics.at(self.metrics.stores, "stored").inc()
        except Exception as exc:
            self.health.failed(exc, op="store")
