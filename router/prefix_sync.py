"""Keeps the prefix index of several gateway replicas in agreement through the `KVStore` log.

Each replica keeps its own in-memory `PrefixIndex` (decisions never wait on Redis). Its own routing
records are applied locally at once and buffered; `sync()` appends the buffer as one entry
`{"r": replica, "u": [[endpoint_id, [hash, ...]], ...]}` to the log `router:prefix:<namespace>`
(a Redis Stream capped at `max_log_len` entries) and then replays entries written by other
replicas since its cursor. A new replica replays the whole (capped) log, so it starts warm.

Staleness: a decision made by replica A is visible to replica B after at most A's sync interval
(flush) plus B's (pull) plus one Redis round trip: <= 2 * `interval_s` + RTT (~100 ms by default).
When the store is unavailable sync fails open: routing continues on the local index, the buffer
is kept (up to `max_pending` records, oldest dropped) and retried on the next sync.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence

import orjson

from fleetgate.core.kvstore import KVStore, StoreUnavailableError
from fleetgate.router.prefix_index import PrefixIndex

log = logging.getLogger(__name__)


class PrefixIndexSync:
    def __init__(
        self,
        *,
        index: PrefixIndex,
        kvstore: KVStore,
        namespace: str = "default",
        replica_id: str | None = None,
        interval_s: float = 0.05,
        max_log_len: int = 100_000,
        max_pending: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.kvstore = kvstore
        self.log_key = f"router:prefix:{namespace}"
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        self.interval_s = interval_s
        self.max_log_len = max_log_len
        self.max_pending = max_pending
        self.clock = clock
        self._pending: list[tuple[str, list[int]]] = []
        self._cursor = "0"
        self._last_sync = -1e18
        self.last_success: float | None = None

    def record(self, endpoint_id: str, hashes: Sequence[int]) -> None:
        self.index.record(endpoint_id, hashes)
        self._pending.append((endpoint_id, list(hashes)))
        if len(self._pending) > self.max_pending:
            del self._pending[: len(self._pending) - self.max_pending]

    def due(self) -> bool:
        return self.clock() - self._last_sync >= self.interval_s

    async def sync(self) -> bool:
        """Flush own records, pull others'. Returns False (and logs) when the store is down."""
        self._last_sync = self.clock()
        try:
            if self._pending:
                batch, self._pending = self._pending, []
                entry = orjson.dumps({"r": self.replica_id, "u": batch})
                try:
                    await self.kvstore.log_append(self.log_key, entry, max_len=self.max_log_len)
                except BaseException:
                    self._pending = batch + self._pending
                    raise
            while True:
                rows = await self.kvstore.log_read(self.log_key, after=self._cursor, count=1000)
                for entry_id, raw in rows:
                    self._cursor = entry_id
                    self._apply(raw)
                if len(rows) < 1000:
                    break
        except StoreUnavailableError as exc:
            log.warning("prefix index sync failed, routing on the local index", extra={"error": str(exc)})
            return False
        self.last_success = self.clock()
        return True

    def _apply(self, raw: bytes) -> None:
        try:
            data = orjson.loads(raw)
            if data.get("r") == self.replica_id:
                return
            for endpoint_id, hashes in data.get("u", []):
                self.index.record(str(endpoint_id), [int(h) for h in hashes])
        except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
            log.warning("skipping a malformed prefix index log entry")
