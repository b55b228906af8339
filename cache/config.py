"""`CacheConfig`: the response cache's settings with the shipped defaults.

The defaults are the ones `fleetgate cache-eval` measures (precision first): a semantic hit needs cosine
similarity >= `semantic.threshold` on the last user message within the same partition *and* the lexical
near-miss verifier's agreement (`fleetgate.cache.verifier`: structural vetoes, then a learned pair model).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class AnswerCheckConfig(BaseModel):
    """Answer-level verification of semantic hits (`fleetgate.cache.answercheck`)."""

    model_config = ConfigDict(extra="forbid")

    sample_rate: float = Field(default=0.05, ge=0.0, le=1.0)  # share of greedy semantic hits checked
    max_false_hit_rate: float = Field(default=0.02, gt=0.0, lt=1.0)  # the bound the similarity floor keeps
    # fresh vs cached answer: equal text, or cosine of their MiniLM embeddings >= this
    answer_similarity: float = Field(default=0.9, ge=-1.0, le=1.0)
    margin: float = Field(default=0.01, ge=0.0, le=0.5)  # an entry's bar: this far above a false hit
    evict_after: int = Field(default=2, ge=1)  # false hits on one entry before it is evicted
    max_in_flight: int = Field(default=2, ge=1)  # concurrent checks; more are skipped, never queued
    window: int = Field(default=1000, ge=10)  # recent checks behind the floor and the estimate
    max_tracked: int = Field(default=10_000, ge=1)  # entries with a raised bar kept in memory
    timeout_s: float = Field(default=60.0, gt=0)


class RemoteEncoderConfig(BaseModel):
    """`semantic.embedder: remote`: MiniLM served by an OpenAI-compatible `/v1/embeddings` endpoint (vLLM's
    pooling runner, an InferenceService with `engine.task: embed`); `fleetgate.cache.remote_encoder`."""

    model_config = ConfigDict(extra="forbid")

    # Base URL of the encoder service (no /v1). None: the endpoints discovery lists for `model` (the
    # InferenceService's pods, or `models:` routes of a static gateway).
    url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")
    model: str = Field(default="all-minilm-l6-v2", min_length=1)  # the served model name sent in each request
    # The longest a lookup waits for its vector, queueing included; past it the lookup goes on without the
    # encoder (what the static prefilter settles alone, else a miss). Also each request's HTTP timeout.
    timeout_ms: float = Field(default=100.0, gt=0, le=60_000)
    batch_max: int = Field(default=64, ge=1, le=2048)  # texts per /v1/embeddings request
    # Bounded wait for more texts while the service is idle; under load batches form while requests are out.
    batch_wait_ms: float = Field(default=0.0, ge=0.0, le=50.0)
    max_in_flight: int = Field(default=4, ge=1, le=64)  # concurrent requests to the service
    # Circuit breaker: after this many failed requests in a row the lookups stop waiting for the service and
    # go on without it at once; one request probes it again every `retry_after_s`.
    failures_to_open: int = Field(default=3, ge=1)
    retry_after_s: float = Field(default=2.0, gt=0)
    # Each request's first answer, and the first after an outage, carries a canary text whose vector must be
    # MiniLM's (cosine >= 0.999): an endpoint serving another model is refused, never trusted.
    check_identity: bool = True


class PairVetoConfig(BaseModel):
    """`semantic.pair_veto`: a MiniLM cross-encoder (`fleetgate.cache.pairveto`) asked about every pair the pair
    model accepts (a would-be hit) and nothing else; below `threshold` the hit is refused (the lookup goes on
    to the next candidate). Misses never run it. A veto that cannot load makes those lookups misses (never
    an unvetted hit) and logs once. Needs the MiniLM package (not with the tests' hashing embedder)."""

    model_config = ConfigDict(extra="forbid")

    # Off by default (issue 30, round 6): on the development data it removed 4 of 5 false hits of the set
    # written with `constraint` rows (frozen4, leave-source-out) for 0-2.3 points of recall, but on the held-out
    # frozen5 it removed none of 3 false hits and refused 2 true ones (98.0% / 67.4% without it, 97.97% / 66.5%
    # with it), at ~4 ms of CPU per would-be hit: not shipped on until held-out data shows a gain
    # (docs/reports/cache-precision-round6.md).
    enabled: bool = False
    # the cross-encoder's probability under which a would-be hit is refused; 0.2 was fixed on the
    # development splits (0.05-0.3 gave the same decisions there; 0.5 cost more recall)
    threshold: float = Field(default=0.2, gt=0.0, lt=1.0)


class SemanticConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    # minilm-onnx-int8: MiniLM on ONNX Runtime, block-wise int8 (cosine >= 0.997 to the reference, same
    # precision/recall at the shipped settings, ~half fp32's CPU); minilm-onnx: fp32 (the reference's vectors
    # to 1e-6); minilm: the reference (sentence-transformers + torch); remote: MiniLM served by an encoder
    # service (`remote`; fp32, the vectors of minilm-onnx to 1e-6); hashing: no model, tests only.
    embedder: Literal["minilm-onnx-int8", "minilm-onnx", "minilm", "remote", "hashing"] = "minilm-onnx-int8"
    remote: RemoteEncoderConfig = Field(default_factory=RemoteEncoderConfig)
    model_dir: str | None = None  # an extracted MiniLM folder; default: extracted from the PyPI package
    # Intra-op threads of the model (ORT: per session; torch: process-wide). One query is tiny: extra threads
    # only add contention (on a busy 2-core box torch with 2 threads took 1.5 s per query vs 75 ms with 1);
    # concurrent lookups are batched instead.
    embed_threads: int | None = Field(default=1, ge=1)
    # Micro-batching of concurrent lookups (fleetgate.core.embed_batcher): up to batch_max texts per encode,
    # collected for at most batch_wait_ms while the worker is idle; under load batches form while it is busy.
    # Measured (int8, one core): a 0.3 ms wait cost ~0.4 ms of CPU per lookup at concurrency 1 and gained
    # nothing at 64 (batches were full either way), hence 0.
    batch_max: int = Field(default=32, ge=1, le=512)
    batch_wait_ms: float = Field(default=0.0, ge=0.0, le=50.0)
    # Exact-text memo of the last embedded texts (per cache partition, text -> vector, LRU; 1.5 kB + the text
    # each): a repeated text (retries, templated prompts, a paraphrase asked again) skips the encoder. 0: off.
    embed_memo: int = Field(default=4096, ge=0, le=1_000_000)
    preload: bool = False  # load the model at start-up; default: on the first semantic lookup (stays small)
    threshold: float = Field(default=0.5, ge=-1.0, le=1.0)  # cosine similarity, before the verifier
    # The static prefilter (MiniLM embedders only): a lookup first searches static token vectors distilled from
    # MiniLM (`fleetgate.core.minilm_static`, microseconds) for the `prefilter_k` nearest entries with static
    # cosine >= `prefilter_threshold`, and runs the verifier's text checks (vetoes) on them. When none survives,
    # the prompt is not encoded: the lookup is a miss, as it would be with the encoder (every candidate vetoed).
    # Otherwise the encoder runs and its own `top_k` join the survivors, so hits are decided as without the
    # prefilter. "off": encode every lookup. The threshold sits under every pair the cache accepts on the
    # development sets and training rows (611 pairs; lowest 0.196, the next 0.29; both texts spelling-corrected
    # as the encoder sees them).
    prefilter: Literal["static", "off"] = "static"
    prefilter_k: int = Field(default=8, ge=1, le=64)
    prefilter_threshold: float = Field(default=0.15, ge=-1.0, le=1.0)
    verify: bool = True  # the near-miss verifier; turning it off is unsafe (see cache-eval)
    # the pair model's acceptance probability; None: the threshold cross-validated with the shipped model
    min_confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int = Field(default=4, ge=1, le=64)  # candidates fetched and verified per lookup
    # A partition is searched exactly (flat scan) up to `ann_above` entries, then by an inverted-file index of
    # `ann_lists` cells scanning the `ann_probe` nearest (`fleetgate.cache.vectorindex`): a flat scan grows
    # linearly (one core: ~0.16 ms at 10k x 256 dimensions, 4.5-6.3 ms at 100k), the IVF index searches 100k
    # in 0.4 ms (`cache-eval --entries 100000`, recall of the exact top k 94-99%).
    ann_above: int = Field(default=10_000, ge=1)
    ann_lists: int = Field(default=256, ge=1, le=4096)
    ann_probe: int = Field(default=8, ge=1, le=4096)
    sync_interval_s: float = Field(default=0.25, ge=0.0)  # max staleness of a replica's index (shared store)
    max_text_chars: int = Field(default=2_000, ge=16)  # longer last messages are exact-only (slots, code)
    answer_check: AnswerCheckConfig | None = None  # vCache-style verification of sampled hits; None: off
    pair_veto: PairVetoConfig = Field(default_factory=PairVetoConfig)  # cross-encoder on would-be hits


class CacheConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    ttl_s: float = Field(default=3_600.0, gt=0)
    max_entries: int = Field(default=100_000, ge=1)  # global bound, FIFO eviction in store order
    max_response_bytes: int = Field(default=256_000, ge=1)  # larger responses are not stored
    # The engine default for an absent temperature is random sampling (OpenAI and vLLM use 1.0 unless a
    # model's generation config says otherwise), so an absent temperature counts as sampled.
    absent_temperature_is_sampled: bool = True
    store_truncated: bool = False  # finish_reason "length": an incomplete answer is not stored
    key_prefix: str = "cache:"
    log_max_len: int | None = None  # default: 2 x max_entries
    backend_retry_s: float = Field(default=1.0, gt=0)  # while the store is down, ping at most this often
    semantic: SemanticConfig = Field(default_factory=SemanticConfig)
