"""The replica-local view of the shared cache: entry order, vectors and the sync from the store's log.

Every stored entry is one KV key (`{prefix}x:{exact key}`, holding the record with a TTL) and one line in
the append-only log `{prefix}log`: `LogEntry(key, partition, expires_at, vector, static)`. Each gateway
replica replays the log into its own `VectorIndex`es and FIFO `order`, so all replicas converge on the same
entries in the same order, whoever stored them.

Two vector spaces: `vector`, the encoder's (MiniLM: what decides a hit), and `static`, the static token
table's (`fleetgate.core.minilm_static`: the prefilter's candidate search). An entry has either or both:
with the prefilter on, a lookup that no candidate survived skips the encoder, so its entry is stored with
the static vector alone; the encoder's vector of such an entry is computed when a later lookup needs it
(`add_vector`, this replica only). A vector whose length is not its index's dimension (a replica with other
settings sharing the store) is not indexed.

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

import base64
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
    vector: np.ndarray | None  # the encoder's float32 unit vector; None: exact-only, or not computed
    static: np.ndarray | None = None  # the static table's unit vector (prefilter on)

    def encode(self) -> bytes:
        meta: dict[str, object] = {"k": self.key, "p": self.partition, "e": self.expires_at,
                                   "d": 0 if self.vector is None else len(self.vector)}
        if self.static is not None:
            # in the head, base64: a replica of the version before the prefilter reads the head's known keys
            # and the body as the encoder's vector, so lines written during a rolling upgrade stay readable
            meta["s"] = base64.b64encode(np.asarray(self.static, dtype=np.float16).tobytes()).decode()
        body = b"" if self.vector is None else np.asarray(self.vector, dtype=np.float16).tobytes()
        return orjson.dumps(meta) + b"\n" + body

    @classmethod
    def decode(cls, raw: bytes) -> LogEntry:
        """Raises ValueError (or KeyError, TypeError) on a line it cannot read."""
        head, _, body = raw.partition(b"\n")
        meta = orjson.loads(head)
        vector = np.frombuffer(body, dtype=np.float16).astype(np.float32) if meta["d"] else None
        static = (np.frombuffer(base64.b64decode(meta["s"], validate=True), dtype=np.float16).astype(np.float32)
                  if meta.get("s") else None)
        return cls(key=str(meta["k"]), partition=str(meta["p"]), expires_at=float(meta["e"]),
                   vector=None if vector is None else _unit(vector), static=None if static is None else _unit(static))


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


class SharedIndex:
    """Order + vectors of the live entries as this replica knows them. Event-loop only (not thread-safe)."""

    def __init__(self, *, dim: int, max_entries: int, ann_above: int = 10_000, ann_lists: int = 256,
                 ann_probe: int = 8, static_dim: int | None = None) -> None:
        self.max_entries = max_entries
        self.vectors = VectorIndex(dim=dim, ann_above=ann_above, ann_lists=ann_lists, ann_probe=ann_probe)
        self.static = (VectorIndex(dim=static_dim, ann_above=ann_above, ann_lists=ann_lists, ann_probe=ann_probe)
                       if static_dim else None)
        self._partition: dict[str, str] = {}  # key -> partition, for vectors added after the entry
        self.order: OrderedDict[str, float] = OrderedDict()  # key -> expires_at, oldest first
        self.cursor = "0"
        self.last_sync = 0.0

    def __len__(self) -> int:
        return len(self.order)

    def reset(self) -> None:
        self.vectors.clear()
        if self.static is not None:
            self.static.clear()
        self._partition.clear()
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
        self._partition[entry.key] = entry.partition
        self.add_vector(entry.key, entry.vector)
        if self.static is not None and entry.static is not None and len(entry.static) == self.static.dim:
            self.static.add(entry_id=entry.key, partition=entry.partition, vector=entry.static)
        evicted: list[str] = []
        while len(self.order) > self.max_entries:
            oldest, expires = next(iter(self.order.items()))
            self.remove(oldest)
            if expires > now:
                evicted.append(oldest)
        return evicted

    def add_vector(self, key: str, vector: np.ndarray | None) -> None:
        """Index the encoder's vector of a live entry (at store, or computed later for a static-only one)."""
        partition = self._partition.get(key)
        if vector is not None and partition is not None and len(vector) == self.vectors.dim:
            self.vectors.add(entry_id=key, partition=partition, vector=vector)

    def remove(self, key: str) -> None:
        self.order.pop(key, None)
        self._partition.pop(key, None)
        self.vectors.remove(key)
        if self.static is not None:
            self.static.remove(key)

    def drop_expired(self, *, now: float | None = None) -> None:
        now = time.time() if now is None else now
        while self.order:
            key, expires = next(iter(self.order.items()))
            if expires > now:
                break
            self.remove(key)
