"""Which prompt-prefix blocks each engine likely holds in its KV cache (approximate, router-side).

Per endpoint an LRU set of chained block hashes (see `fleetgate.router.hashing`), bounded by that
engine's KV capacity expressed in router blocks: `capacity_blocks = kv_capacity_tokens *
chars_per_token / block_chars`. `record(endpoint, hashes)` is called when a request is sent there;
blocks are touched deepest first so that, as in vLLM, a chain's tail is evicted before its shared
head. `match(endpoint, hashes)` returns the longest run of leading blocks present: since hash i
covers blocks 0..i, a hit on block i means the whole prefix up to i was sent there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    def __init__(self, *, default_capacity_blocks: int) -> None:
        if default_capacity_blocks <= 0:
            raise ValueError("default_capacity_blocks must be positive")
        self.default_capacity_blocks = default_capacity_blocks
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}

    def set_capacity(self, endpoint_id: str, blocks: int) -> None:
        self._capacity[endpoint_id] = max(1, blocks)
        self._trim(endpoint_id)

    def capacity(self, endpoint_id: str) -> int:
        return self._capacity.get(endpoint_id, self.default_capacity_blocks)

    def record(self, endpoint_id: str, hashes: Sequence[int]) -> None:
        lru = self._lru.get(endpoint_id)
        if lru is None:
            lru = self._lru[endpoint_id] = OrderedDict()
        for h in reversed(hashes):
            lru[h] = None
            lru.move_to_end(h)
        self._trim(endpoint_id)

    def _trim(self, endpoint_id: str) -> None:
        lru = self._lru.get(endpoint_id)
        if lru is None:
            return
        cap = self.capacity(endpoint_id)
        while len(lru) > cap:
            lru.popitem(last=False)

    def match(self, endpoint_id: str, hashes: Sequence[int]) -> int:
        lru = self._lru.get(endpoint_id)
        if not lru:
            return 0
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def size(self, endpoint_id: str) -> int:
        lru = self._lru.get(endpoint_id)
        return 0 if lru is None else len(lru)

    def drop(self, endpoint_id: str) -> None:
        self._lru.pop(endpoint_id, None)
        self._capacity.pop(endpoint_id, None)
