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

`admit` and `grow` are vLLM v1's way (`KVCacheManager.allocate_slots`): a request takes blocks only for
the tokens computed so far and grows its `Held` blocks step by step (the rest of a chunked prompt, then one
block every `block_size` generated tokens). Both are all-or-nothing too and count cached blocks that are
evictable (nobody holds them) as free, as vLLM's free-block queue does; a cached block the request itself
reuses is not counted twice.
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


@dataclass(slots=True)
class Held:
    """The blocks one request holds, in order: its prompt's full (hashed) blocks, then private ones."""

    hashes: list[int]
    private_blocks: int = 0
    hit_blocks: int = 0  # leading blocks that were cached when the request was admitted

    @property
    def blocks(self) -> int:
        return len(self.hashes) + self.private_blocks


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
        self._pin(hashes[:hit])
        self._evict_until(need)
        for h in new:
            if h in self._refs:  # present beyond the capped hit: pin it as a reuse
                if self._refs[h] == 0:
                    del self._evictable[h]
                self._refs[h] += 1
            else:
                self._refs[h] = 1
        self._private += private_blocks
        return Allocation(hashes=tuple(hashes), private_blocks=private_blocks, hit_blocks=hit)

    def admit(self, hashes: Sequence[int], *, hit_blocks: int, total_blocks: int) -> Held | None:
        """Hold the first `hit_blocks` of `hashes` (cached: `match` said so) and `total_blocks` in all."""
        held = Held(hashes=[], hit_blocks=hit_blocks)
        return held if self.grow(held, hashes, total_blocks=total_blocks) else None

    def grow(self, held: Held, hashes: Sequence[int], *, total_blocks: int) -> bool:
        """Extend `held` to `total_blocks` blocks (hashed while the prompt's full blocks last, then private);
        False, and nothing changes, when they cannot be had even after evicting every evictable block."""
        extra = total_blocks - held.blocks
        if extra <= 0:
            return True
        start = len(held.hashes)
        new_hashed = list(hashes[start:min(total_blocks, len(hashes))]) if held.private_blocks == 0 else []
        private = extra - len(new_hashed)
        reused = {h for h in new_hashed if h in self._refs}
        fresh = len(new_hashed) - len(reused) + private
        evictable_reused = sum(1 for h in reused if self._refs[h] == 0)
        if fresh > self.free_blocks() + len(self._evictable) - evictable_reused:
            return False
        self._pin([h for h in new_hashed if h in reused])  # before evicting, so the eviction cannot take them
        self._evict_until(fresh)
        for h in new_hashed:
            if h not in reused:
                self._refs[h] = 1
        self._private += private
        held.hashes.extend(new_hashed)
        held.private_blocks += private
        return True

    def free(self, held: Held) -> None:
        """Give back a request's blocks, tail first (its deepest blocks become the first to evict)."""
        self._unpin(held.hashes, private_blocks=held.private_blocks)
        held.hashes.clear()
        held.private_blocks = 0

    def reset(self) -> None:
        """Drop every evictable cached block (blocks pinned by running requests stay)."""
        for h in self._evictable:
            del self._refs[h]
        self._evictable.clear()

    def _pin(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            if self._refs[h] == 0:
                del self._evictable[h]
            self._refs[h] += 1

    def _evict_until(self, free: int) -> None:
        while self.free_blocks() < free:
            victim, _ = self._evictable.popitem(last=False)
            del self._refs[victim]

    def release(self, alloc: Allocation) -> None:
        self._unpin(alloc.hashes, private_blocks=alloc.private_blocks)

    def _unpin(self, hashes: Sequence[int], *, private_blocks: int) -> None:
        self._private -= private_blocks
        for h in reversed(hashes):  # tail first: a chain's deepest blocks become the first to evict
            refs = self._refs[h] - 1
            self._refs[h] = refs
            if refs == 0:
                self._evictable[h] = None
