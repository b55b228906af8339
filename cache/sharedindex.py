"""The replica-local view of the shared cache: entry order, vectors and the sync from the store's log.

Every stored entry is one KV key (`{prefix}x:{exact key}`, holding the record with a TTL) and one line in
the append-only log `{prefix}log`: `LogEntry(key, partition, expires_at, vector)`. Each gateway replica
replays the log into its own `VectorIndex` and FIFO `order`, so all replicas converge on the same entries
in the same order, whoever stored them.

Staleness: a replica replays the log before a semantic lookup when its last replay is older than
`sync_interval_s` (default 0.25 s), so an entry stored by another replica is found by exact lookups at
once (they read the KV key) and by semantic lookups within `sync_interval_s` plus one round trip. Entries
stored by this replica are indexed immediately (with the in-process `MemoryKVStore` that is all there
is: one process, one writer, no replay). A replica that starts (or that reconnects after the store
was down) replays the whole log, which is trimmed to `log_max_len` (default 2 x `max_entries`).

Eviction: when more than `max_entries` entries are live, the oldest in log order go first (every replica
drops them from its index; the replica that stored the entry that overflowed also deletes their keys).
Expired entries leave the index lazily: at replay time (their `expires_at` is in the log) and when a
candidate's key is found missing.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import orjson

from fleetgate.cache.vectorindex import VectorIndex


@dataclass(frozen=True, slots=True)
class LogEntry:
    key: str  # the exact key; the record lives at {prefix}x:{key}
    partition: str
    expires_at: float  # wall-clock seconds
    vector: np.ndarray | None  # float32 unit vector; None for exact-only entries

    def encode(self) -> bytes:
        head = orjson.dumps({"k": self.key, "p": self.partition, "e": self.expires_at,
                             "d": 0 if self.vector is None else len(self.vector)})
        body = b"" if self.vector is None else np.asarray(self.vector, dtype=np.float16).tobytes()
        return head + b"\n" + body

    @classmethod
    def decode(cls, raw: bytes) -> LogEntry:
        head, _, body = raw.partition(b"\n")
        meta = orjson.loads(head)
        vector = np.frombuffer(body, dtype=np.float16).astype(np.float32) if meta["d"] else None
        if vector is not None:
            norm = float(np.linalg.norm(vector))
            vector = vector / norm if norm > 0 else vector
        return cls(key=meta["k"], partition=meta["p"], expires_at=float(meta["e"]), vector=vector)


class SharedIndex:
    """Order + vectors of the live entries as this replica knows them. Event-loop only (not thread-safe)."""

    def __init__(self, *, dim: int, max_entries: int, hnsw_above: int, hnsw_m: int, hnsw_ef_search: int) -> None:
        self.max_entries = max_entries
        self.vectors = VectorIndex(dim=dim, hnsw_above=hnsw_above, hnsw_m=hnsw_m, hnsw_ef_search=hnsw_ef_search)
        self.order: OrderedDict[str, float] = OrderedDict()  # key -> expires_at, oldest first
        self.cursor = "0"
        self.last_sync = 0.0

    def __len__(self) -> int:
        return len(self.order)

    def reset(self) -> None:
        self.vectors.clear()
        self.order.clear()
        self.cursor = "0"
        self.last_sync = 0.0

    def apply(self, entry: LogEntry, *, now: float | None = None) -> list[str]:
        """Index one log entry; returns the keys evicted to stay within `max_entries`."""
        now = time.time() if now is None else now
        if self.order.get(entry.key) == entry.expires_at:
            return []  # already applied (this replica stored it, then replayed its own log line)
        if entry.key in self.order:  # stored again: it moves to the end, with the new vector
            self.remove(entry.key)
        if entry.expires_at <= now:
            return []
        self.order[entry.key] = entry.expires_at
        if entry.vector is not None:
            self.vectors.add(entry_id=entry.key, partition=entry.partition, vector=entry.vector)
        evicted: list[str] = []
        while len(self.order) > self.max_entries:
            oldest, expires = next(iter(self.order.items()))
            self.remove(oldest)
            if expires > now:
                evicted.append(oldest)
        return evicted

    def remove(self, key: str) -> None:
        self.order.pop(key, None)
        self.vectors.remove(key)

    def drop_expired(self, *, now: float | None = None) -> None:
        now = time.time() if now is None else now
        while self.order:
            key, expires = next(iter(self.order.items()))
            if expires > now:
                break
            self.remove(key)
