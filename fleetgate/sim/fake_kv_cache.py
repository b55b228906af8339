"""The fake engine's prefix cache: which prompt blocks it holds, published as vLLM KV events.

Not a model of vLLM's allocator: enough to drive precise prefix routing end to end without a real engine.
A prompt's tokens are its words (the fake engine's usage counts words too), each mapped to a stable token
id; `/tokenize` answers them in vLLM's shape. `admit(tokens)` is one request's prefill: the leading full
blocks already held are hits (counted as vLLM's `prefix_cache_hits`/`queries` in tokens), the others are
stored and published as one `BlockStored` (each block named by a random 64-bit hash of this engine's
own, chained through `parent_block_hash`, as vLLM does with an unpinned `PYTHONHASHSEED`); past
`capacity_blocks` the least recently used blocks are evicted and published as `BlockRemoved`.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import xxhash

from fleetgate.router.kv_events import BlockRemoved, BlockStored, KvEvent
from fleetgate.sim.kv_publisher import FakeKvPublisher

VOCAB = 50_000


def word_tokens(body: Mapping[str, Any]) -> list[int]:
    """The fake tokenizer: one token per whitespace-separated word of the prompt or of the messages' contents."""
    if isinstance(body.get("messages"), list):
        text = " ".join(str(m.get("content") or "") for m in body["messages"] if isinstance(m, dict))
    else:
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt)) if isinstance(prompt, list) else ""
    return [xxhash.xxh32_intdigest(word.encode()) % VOCAB for word in text.split()]


class FakePrefixCache:
    def __init__(self, *, publisher: FakeKvPublisher, block_size: int = 4, capacity_blocks: int = 1024,
                 seed: int | None = None) -> None:
        self.publisher = publisher
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.rng = random.Random(seed)
        self.blocks: OrderedDict[tuple[int, ...], int] = OrderedDict()  # token prefix -> engine block hash
        self.queries = 0
        self.hits = 0

    async def admit(self, tokens: list[int]) -> int:
        """One request's prefill; returns the prompt tokens served from the cache."""
        size = self.block_size
        n = len(tokens) // size
        self.queries += len(tokens)
        hit = 0
        while hit < n and tuple(tokens[: (hit + 1) * size]) in self.blocks:
            hit += 1
        self.hits += hit * size
        events: list[KvEvent] = []
        new = [self.rng.getrandbits(64) for _ in range(hit, n)]
        # Touch the whole chain tail first, so that (as in vLLM) a chain's tail is evicted before its head.
        for i in reversed(range(n)):
            key = tuple(tokens[: (i + 1) * size])
            if i >= hit:
                self.blocks[key] = new[i - hit]
            self.blocks.move_to_end(key)
        if new:
            parent = self.blocks[tuple(tokens[: hit * size])] if hit else None
            events.append(BlockStored(block_hashes=tuple(new), parent_block_hash=parent,
                                      token_ids=tuple(tokens[hit * size: n * size]), block_size=size, medium="GPU",
                                      group_idx=0, spec_kind="full_attention"))
        evicted = []
        while len(self.blocks) > self.capacity_blocks:
            evicted.append(self.blocks.popitem(last=False)[1])
        if evicted:
            events.append(BlockRemoved(block_hashes=tuple(evicted), medium="GPU", group_idx=0))
        if events:
            await self.publisher.publish(events)
        return hit * size
