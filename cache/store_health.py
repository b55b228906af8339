"""Whether the response cache's shared store answers, and what a request does meanwhile.

A store error turns the cache off for requests (they go on uncached, never waiting); while it is off, a lookup
starts a background ping at most every `retry_s` and answers "unavailable" at once; when the store answers
again, `on_back` runs (the cache rebuilds its index from the store's log) and the cache is on again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from fleetgate.cache.metrics import CacheMetrics
from fleetgate.core.kvstore import KVStore, StoreUnavailableError

log = logging.getLogger("fleetgate.cache")


class StoreHealth:
    def __init__(self, *, kv: KVStore, retry_s: float, metrics: CacheMetrics, on_back: Callable[[], None]) -> None:
        self.kv = kv
        self.retry_s = retry_s
        self.metrics = metrics
        self.on_back = on_back
        self.up = True
        self.probe: asyncio.Task[None] | None = None
        self._next_ping = 0.0

    def failed(self, exc: Exception, *, op: str) -> None:
        self.metrics.backend_errors.inc()
        if isinstance(exc, StoreUnavailableError):
            if self.up:
                log.warning("response cache off: %s failed: %s (requests go on uncached)", op, exc)
            self.up = False
            self.metrics.backend_up.set(0)
            self._next_ping = time.monotonic() + self.retry_s
        else:
            log.exception("response cache %s failed; request goes on uncached", op)

    async def available(self) -> bool:
        """Up, or (while down) start a background probe at most every `retry_s` and answer False: a request
        never waits for a ping to a dead store."""
        if self.up:
            return True
        if time.monotonic() >= self._next_ping and (self.probe is None or self.probe.done()):
            self._next_ping = time.monotonic() + self.retry_s
            self.probe = asyncio.create_task(self._ping(), name="cache-store-probe")
        return False

    async def _ping(self) -> None:
        if not await self.kv.ping():
            return
        log.warning("response cache back on: the store answers again; rebuilding the index from its log")
        self.on_back()
        self.up = True
        self.metrics.backend_up.set(1)
