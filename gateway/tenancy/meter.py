"""Tokens served per model over a trailing window, shared by every gateway replica (GPU-derived prices).

Each engine-served request adds its prompt, completion and cached tokens to per-minute counters in the
KV store (`KVStore.incr`, atomic on Redis). `served(model, window_s)` sums the minute buckets that fall
in the window and reports the span actually covered: the whole window, or less when the model was first
seen more recently (so a fresh deployment is not charged an hour of GPU time for five minutes of work).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from fleetgate.core.kvstore import KVStore
from fleetgate.core.types import Usage

BUCKET_S = 60


@dataclass(frozen=True, slots=True)
class Served:
    prompt: int
    completion: int
    cached: int
    span_s: float


class TokenMeter:
    def __init__(self, store: KVStore, *, prefix: str = "tenancy:meter:") -> None:
        self._store = store
        self._prefix = prefix

    def _key(self, model: str, kind: str, bucket: int) -> str:
        return f"{self._prefix}{model}:{kind}:{bucket}"

    async def add(self, model: str, usage: Usage, *, now: float | None = None) -> None:
        t = time.time() if now is None else now
        bucket = int(t // BUCKET_S)
        ttl = 2 * 24 * 3600.0  # longer than any sensible window; buckets are tiny
        since_key = f"{self._prefix}{model}:since"
        if await self._store.get(since_key) is None:
            await self._store.set(since_key, str(bucket * BUCKET_S).encode())
        for kind, amount in (
            ("prompt", usage.prompt_tokens),
            ("completion", usage.completion_tokens),
            ("cached", usage.cached_tokens),
        ):
            if amount:
                await self._store.incr(self._key(model, kind, bucket), amount, ttl_s=ttl)

    async def served(self, model: str, *, window_s: float, now: float | None = None) -> Served:
        t = time.time() if now is None else now
        last = int(t // BUCKET_S)
        first = int((t - window_s) // BUCKET_S) + 1
        buckets = range(first, last + 1)
        kinds = ("prompt", "completion", "cached")
        keys = [self._key(model, kind, b) for kind in kinds for b in buckets]
        values = await self._store.mget(keys)
        n = len(buckets)
        sums = [sum(int(v or 0) for v in values[i * n : (i + 1) * n]) for i in range(len(kinds))]
        since_raw = await self._store.get(f"{self._prefix}{model}:since")
        since = float(since_raw) if since_raw is not None else t
        span = max(0.0, min(window_s, t - since))
        return Served(prompt=sums[0], completion=sums[1], cached=sums[2], span_s=span)
