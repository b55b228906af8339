"""Prometheus metrics of the response cache, registered in the app's own `CollectorRegistry`."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetgate.core.telemetry import LATENCY_BUCKETS


class AnswerCheckMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.checks = Counter(
            "fleetgate_cache_answer_checks_total",
            "Semantic hits checked against a fresh engine answer, by result (agree, false_hit, skipped_busy, "
            "skipped_budget, skipped_concurrency, error).",
            ["result"],
            registry=registry,
        )
        self.false_hit_rate = Gauge(
            "fleetgate_cache_false_hit_rate_estimate",
            "Estimated false-hit rate of semantic hits over the recent answer checks (Beta(1,1) posterior mean).",
            registry=registry,
        )
        self.floor = Gauge(
            "fleetgate_cache_semantic_similarity_floor",
            "Similarity below which semantic hits are refused, adapted from answer checks (0: no floor).",
            registry=registry,
        )
        self.tokens = Counter(
            "fleetgate_cache_answer_check_tokens_total",
            "Engine tokens spent on answer checks: the gateway's own cost, not billed to a tenant.",
            registry=registry,
        )
        self.evictions = Counter(
            "fleetgate_cache_answer_check_evictions_total",
            "Entries evicted after repeated false hits.",
            registry=registry,
        )


_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class EncoderMetrics:
    """The semantic layer's encoder: requests to an encoder service (`semantic.embedder: remote`) and the
    lookups that went on without the encoder (any embedder)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "fleetgate_cache_encoder_requests_total",
            "Requests to the encoder service, by result (ok, timeout, error, garbage, identity).",
            ["result"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "fleetgate_cache_encoder_request_seconds",
            "Round trip of one request to the encoder service (failed ones included).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_texts = Histogram(
            "fleetgate_cache_encoder_batch_texts",
            "Texts per answered request to the encoder service (concurrent lookups coalesced).",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.up = Gauge(
            "fleetgate_cache_encoder_up",
            "1 while the encoder service's circuit is closed, 0 while lookups go on without it.",
            registry=registry,
        )
        self.fallbacks = Counter(
            "fleetgate_cache_encoder_fallbacks_total",
            "Semantic lookups that went on without the encoder (only what the static prefilter settles, else a "
            "miss), by reason (timeout, error, garbage, identity, circuit_open, no_endpoint).",
            ["reason"],
            registry=registry,
        )
        self.up.set(1)
        self._requests = {r: self.requests.labels(r) for r in ("ok", "timeout", "error", "garbage", "identity")}

    def observe(self, *, result: str, seconds: float, texts: int, up: bool) -> None:
        """One request's outcome (`texts`: rows answered, 0 for a failure)."""
        self._requests[result].inc()
        self.request_seconds.observe(seconds)
        if texts:
            self.batch_texts.observe(texts)
        self.up.set(1 if up else 0)


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.lookups = Counter(
            "fleetgate_cache_lookups_total",
            "Cache lookups by layer (exact, semantic, none) and result (hit, miss, bypass, rejected, error).",
            ["layer", "result"],
            registry=registry,
        )
        self.lookup_seconds = Histogram(
            "fleetgate_cache_lookup_seconds",
            "Time spent in a cache lookup, by layer (exact: key fetch; semantic: embed + search + fetch).",
            ["layer"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.stage_seconds = Histogram(
            "fleetgate_cache_semantic_stage_seconds",
            "Where a semantic lookup spends its time: static, prefilter, embed, sync, search, fetch, verify, "
            "veto (the pair veto on would-be hits).",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.rejections = Counter(
            "fleetgate_cache_verifier_rejections_total",
            "Semantic candidates rejected by the near-miss verifier, by rule: those above the similarity threshold, "
            "and with the static prefilter those its text checks veto before encoding; pair_veto: would-be hits the "
            "pair veto refused; pair_veto_unavailable: would-be hits made misses while it loads or after it failed.",
            ["reason"],
            registry=registry,
        )
        self.prefilter = Counter(
            "fleetgate_cache_prefilter_total",
            "Semantic lookups by what the static prefilter decided: skipped (no candidate survived the text "
            "checks: the prompt was not encoded), matched (a candidate's every word matched: served without "
            "encoding) or encoded.",
            ["outcome"],
            registry=registry,
        )
        self.stores = Counter(
            "fleetgate_cache_stores_total",
            "Responses offered to the cache, by result (stored, or why not).",
            ["result"],
            registry=registry,
        )
        self.entries = Gauge(
            "fleetgate_cache_entries",
            "Entries this replica's index knows (synced from the shared log), by layer.",
            ["layer"],
            registry=registry,
        )
        self.evictions = Counter(
            "fleetgate_cache_evictions_total",
            "Entries evicted by this replica because the size bound was reached.",
            registry=registry,
        )
        self.backend_up = Gauge(
            "fleetgate_cache_backend_up",
            "1 when the cache's store answers, 0 while caching is off because it does not.",
            registry=registry,
        )
        self.backend_errors = Counter(
            "fleetgate_cache_backend_errors_total",
            "Store operations of the cache that failed (the request went on without the cache).",
            registry=registry,
        )
        self.backend_up.set(1)
        self.answer_check = AnswerCheckMetrics(registry)
        self.encoder = EncoderMetrics(registry)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def at(self, metric: Any, *values: str) -> Any:
        """`metric.labels(*values)`, memoised: prometheus_client's own lookup (a lock and a dict) costs ~3 µs
        and a semantic lookup labels ~20 times. Label values come from small fixed sets."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child
