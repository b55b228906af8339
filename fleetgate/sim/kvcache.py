"""A paged KV cache with automatic prefix caching, modelled on vLLM's block manager.

The cache holds `num_blocks` blocks. Full prompt blocks are identified by their chained hash
(block i covers tokens 0..i, see `fleetgate.router.hashing`), so a new request reuses the longest
run of leading blocks already present. Blocks are reference-counted while requests run; a block
whose count drops to zero stays cached but becomes evictable, in LRU order. A finished request's
blocks are released tail first, so a chain's deepest blocks are evicted before its shared head
(as vLLM's free-block queue does). Private blocks (the partial last prompt block and decode
blocks) are counted but never shared.

`allocate` is all-or-nothing: it returns `None` when the request does not fit even after evicting
every evictable block, and the request waits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Allocation:
    hashes: tuple[int, ...]  # shared (hashed) blocks pinned by the request
    private_blocks: int
    hit_blocks: int  # leading blocks that were already cached


class PrefixKVCache:
    def __init__(self, *, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self._refs: dict[int, int] = {}  # cached block hash -> running requests using it
        self._evictable: OrderedDict[int, None] = OrderedDict()  # refs == 0, oldest first
        self._private = 0

    def match(self, hashes: Sequence[int]) -> int:
        """Number of leading blocks of `hashes` present in the cache."""
        n = 0
        for h in hashes:
            if h not in self._refs:
                break
            n += 1
        return n

    @property
    def used_blocks(self) -> int:
        """Blocks pinned by running requests (vLLM's `kv_cache_usage_perc` numerator)."""
        return len(self._refs) - len(self._evictable) + self._private

    @property
    def cached_blocks(self) -> int:
        return len(self._refs)

    def free_blocks(self) -> int:
        return self.num_blocks - len(self._refs) - self._private

    def allocate(self, hashes: Sequence[int], *, private_blocks: int, max_hit_blocks: int) -> Allocation | None:
        hit = min(self.match(hashes), max_hit_blocks)
        new = hashes[hit:]
        need = len(new) + private_blocks
        reusable = sum(1 for h in hashes[:hit] if h in self._evictable)
        if need > self.free_blocks() + len(self._evictable) - reusable:
            return None
        for h in hashes[:hit]:
            if self._refs[h] == 0:
                del self._evictable[h]
            self._refs[h] += 1
        while self.free_blocks() < need:
            victim, _ = self._evictable.popitem(last=False)
            del self._refs[victim]
        for h in new:
            if h in self._refs:  # present beyond the capped hit: pin it as a reuse
                if self._refs[h] == 0:
                    del self._evictable[h]
                self._refs[h] += 1
            else:
                self._refs[h] = 1
        self._private += private_blocks
        return Allocation(hashes=tuple(hashes), private_blocks=private_blocks, hit_blocks=hit)

    def reset(self) -> None:
        """Drop every evictable cached block (blocks pinned by running requests stay)."""
        for h in self._evictable:
            del self._refs[h]
        self._evictable.clear()

    def release(self, alloc: Allocation) -> None:
        self._private -= alloc.private_blocks
        for h in reversed(alloc.hashes):
            refs = self._refs[h] - 1
            self._refs[h] = refs
            if refs == 0:
                self._evictable[h] = None
