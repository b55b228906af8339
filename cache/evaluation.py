"""Precision and recall of the response cache on labelled pairs and conversations.

Each labelled row runs through the real `TwoLayerCache` (in-memory store, fresh per row): the answer to
`a` (or `conv_a`) is stored, then `b` (or `conv_b`) is looked up. A hit on a row labelled `same=false` is
a false hit; recall is hits over the `same=true` rows. Every row is also looked up by another tenant,
which must never hit. Embeddings are computed once per text (`MemoEmbedder`) so a threshold sweep costs
only cache operations.

The cross-validation column of `fleetgate cache-eval` is computed apart, on the pair model's out-of-fold
probabilities (`fleetgate.cache.training`), with the same gates as a lookup.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from prometheus_client import CollectorRegistry

from fleetgate.cache.config import CacheConfig
from fleetgate.cache.embedding import Embedder
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.cache.types import CacheRequest, CacheStatus
from fleetgate.core.kvstore import MemoryKVStore

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


class MemoEmbedder:
    """Wraps an embedder; each distinct text is embedded once (batched by `prime`)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.dim = inner.dim
        self._memo: dict[str, np.ndarray] = {}

    def prime(self, texts: Iterable[str], *, batch: int = 64, progress: Any = None) -> None:
        todo = sorted({t for t in texts if t not in self._memo})
        for start in range(0, len(todo), batch):
            chunk = todo[start : start + batch]
            for text, vector in zip(chunk, self.inner.embed(chunk), strict=True):
                self._memo[text] = vector
            if progress is not None:
                progress(f"embedded {min(start + batch, len(todo))}/{len(todo)} texts")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in texts if t not in self._memo]
        if missing:
            self.prime(missing)
        return np.stack([self._memo[t] for t in texts])


@dataclass(slots=True)
class Score:
    rows: int = 0
    positives: int = 0
    hits: int = 0
    true_hits: int = 0
    false_by_kind: Counter[str] = field(default_factory=Counter)
    rows_by_kind: Counter[str] = field(default_factory=Counter)
    cross_tenant_hits: int = 0

    @property
    def false_hits(self) -> int:
        return self.hits - self.true_hits

    @property
    def precision(self) -> float:
        return self.true_hits / self.hits if self.hits else 1.0

    @property
    def recall(self) -> float:
        return self.true_hits / self.positives if self.positives else 0.0


def load_rows(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def conversations(row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(a, b) message lists of a pairs row or a conversations row."""
    if "conv_a" in row:
        return list(row["conv_a"]), list(row["conv_b"])
    return ([SYSTEM, {"role": "user", "content": row["a"]}], [SYSTEM, {"role": "user", "content": row["b"]}])


def texts_of(rows: Iterable[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for row in rows:
        a, b = conversations(row)
        out += [str(a[-1]["content"]), str(b[-1]["content"])]
    return out


def _request(messages: list[dict[str, Any]], *, tenant: str) -> CacheRequest:
    return CacheRequest(tenant=tenant, model="eval-model", kind="chat",
                        body={"model": "eval-model", "messages": messages, "temperature": 0})


def _answer(row_id: str) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "eval-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer to {row_id}"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


async def _row_hits(row: dict[str, Any], config: CacheConfig, embedder: Embedder,
                    prefilter: Embedder | None) -> tuple[bool, bool]:
    """(b hits a's entry for the same tenant, b hits it for another tenant)."""
    cache = TwoLayerCache(config=config, kvstore=MemoryKVStore(), embedder=embedder,
                          metrics=CacheMetrics(CollectorRegistry()), prefilter=prefilter)
    a, b = conversations(row)
    first = await cache.lookup(_request(a, tenant="tenant-a"))
    await cache.store(_request(a, tenant="tenant-a"), first, _answer(str(row["id"])))
    mine = await cache.lookup(_request(b, tenant="tenant-a"))
    foreign = await cache.lookup(_request(b, tenant="tenant-b"))
    hit_statuses = (CacheStatus.HIT_EXACT, CacheStatus.HIT_SEMANTIC)
    return mine.status in hit_statuses, foreign.status in hit_statuses


async def row_hits(rows: Sequence[dict[str, Any]], config: CacheConfig, embedder: Embedder,
                   prefilter: Embedder | None = None) -> list[bool]:
    """Whether each row's `b` hits its `a` (same tenant): the cache's decision, row by row."""
    return [(await _row_hits(row, config, embedder, prefilter))[0] for row in rows]


async def score_rows(rows: Sequence[dict[str, Any]], config: CacheConfig, embedder: Embedder,
                     prefilter: Embedder | None = None) -> Score:
    """Each row through a fresh cache; `prefilter`: the static embedder of `semantic.prefilter` (None: off)."""
    s = Score()
    for row in rows:
        hit, foreign = await _row_hits(row, config, embedder, prefilter)
        s.rows += 1
        s.positives += bool(row["same"])
        s.hits += hit
        s.true_hits += hit and bool(row["same"])
        s.cross_tenant_hits += foreign
        s.rows_by_kind[str(row["kind"])] += 1
        if hit and not row["same"]:
            s.false_by_kind[str(row["kind"])] += 1
    return s


async def sweep(rows: Sequence[dict[str, Any]], configs: Sequence[CacheConfig], embedder: Embedder,
                prefilter: Embedder | None = None) -> list[Score]:
    return [await score_rows(rows, c, embedder, prefilter) for c in configs]


async def crowded_rows(rows: Sequence[dict[str, Any]], config: CacheConfig, embedder: Embedder,
                       prefilter: Embedder | None = None) -> tuple[Score, int]:
    """Pairs in one crowded partition: every row's `a` stored in one cache (one tenant, model and system
    prompt), then every `b` looked up among them all. A hit counts as right only when it serves an entry
    whose prompt is the row's own `a` on a `same` row. Returns the score and how many lookups encoded (with
    the prefilter; every lookup without it). What per-row scoring cannot show: candidate search among many
    near neighbours (the encoder's `top_k`, the prefilter's `prefilter_k`)."""
    metrics = CacheMetrics(CollectorRegistry())
    cache = TwoLayerCache(config=config.model_copy(update={"max_entries": max(config.max_entries, 2 * len(rows))}),
                          kvstore=MemoryKVStore(), embedder=embedder, metrics=metrics, prefilter=prefilter)
    for row in rows:
        a = [SYSTEM, {"role": "user", "content": str(row["a"])}]
        first = await cache.lookup(_request(a, tenant="tenant-a"))
        if first.status == CacheStatus.MISS:
            await cache.store(_request(a, tenant="tenant-a"), first, _answer(str(row["a"])))
    s, encoded = Score(), 0
    for row in rows:
        found = await cache.lookup(_request([SYSTEM, {"role": "user", "content": str(row["b"])}], tenant="tenant-a"))
        hit = found.status in (CacheStatus.HIT_EXACT, CacheStatus.HIT_SEMANTIC)
        encoded += found.state.get("vector") is not None
        served = (found.response or {}).get("choices", [{}])[0].get("message", {}).get("content", "")
        right = hit and bool(row["same"]) and served == f"answer to {row['a']}"
        s.rows += 1
        s.positives += bool(row["same"])
        s.hits += hit
        s.true_hits += right
        s.rows_by_kind[str(row["kind"])] += 1
        if hit and not right:
            s.false_by_kind[str(row["kind"])] += 1
    return s, encoded
