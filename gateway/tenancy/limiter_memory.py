"""Limit counters in process memory, with the same semantics as the Redis scripts.

Used when no Redis is configured (one gateway process). Check-and-add runs without an `await` in
between, so on the event loop it is as atomic as the Lua script is in Redis. Counters expire after their
TTL, checked lazily on access. Epochs (counter generations) and `adjust` follow the Redis scripts
(`limiter_redis`); `forget()` drops everything, as a Redis restart without persistence does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from fleetgate.gateway.tenancy.limiter_circuit import Move
from fleetgate.gateway.tenancy.limiter_windows import Check, window_load


class MemoryCounters:
    """`CounterBackend` in memory."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[int, float]] = {}  # key -> (value, monotonic expiry)
        self._epochs: dict[str, str] = {}  # epoch key -> generation id (no expiry)

    def forget(self) -> None:
        """Lose every counter and epoch (a store restarted without persistence)."""
        self._values.clear()
        self._epochs.clear()

    def _get(self, key: str) -> int | None:
        item = self._values.get(key)
        if item is None:
            return None
        if item[1] <= time.monotonic():
            del self._values[key]
            return None
        return item[0]

    async def reserve(self, checks: Sequence[Check], *, now_ms: int, epoch_key: str,
                      nonce: str) -> tuple[int, int, int, str]:
        for i, c in enumerate(checks, start=1):
            cur = self._get(c.key) or 0
            prev = (self._get(c.prev_key) or 0) if c.sliding else 0
            if window_load(check=c, cur=cur, prev=prev, now_ms=now_ms) + c.amount > c.limit:
                return i, cur, prev, ""
        epoch = self._epochs.setdefault(epoch_key, nonce)
        expires_base = time.monotonic()
        for c in checks:
            cur = self._get(c.key) or 0
            self._values[c.key] = (cur + c.amount, expires_base + c.ttl_ms / 1000)
        return 0, 0, 0, epoch

    async def adjust(self, moves: Sequence[Move]) -> None:
        for m in moves:
            if self._get(m.key) is not None:
                value, expires = self._values[m.key]
                same = bool(m.epoch) and self._epochs.get(m.epoch_key) == m.epoch
                self._values[m.key] = (value + (m.delta if same else m.absolute), expires)
            elif m.absolute > 0 and m.ttl_ms > 0:
                self._values[m.key] = (m.absolute, time.monotonic() + m.ttl_ms / 1000)

    async def read(self, keys: Sequence[str]) -> list[int]:
        return [self._get(k) or 0 for k in keys]
