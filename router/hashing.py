"""Chained block hashes of a prompt, the key of prefix affinity.

Algorithm: cut `text` (UTF-8 bytes) into consecutive blocks of `block_chars` bytes; only full
blocks count, as an engine only caches full KV blocks. Block i's hash is
`h_i = xxh3_64(block_i, seed=h_{i-1})` with `h_{-1} = 0`, so h_i covers blocks 0..i: equal hashes
mean equal *prefixes*, not merely equal blocks. The digest is stable across processes and
machines (unlike `hash()`), so gateway replicas that share an index through Redis agree on it.

Inputs: the prompt text; `block_chars` (bytes per block: 512 ~= 128 tokens at ~4 chars per
token); `max_blocks` (cap on hashed blocks, bounding the cost of very long prompts).
Cost: one xxh3 call per block, ~0.2-1 us each depending on the machine.
"""

from __future__ import annotations

import xxhash


def chained_block_hashes(text: str, *, block_chars: int, max_blocks: int | None = None) -> list[int]:
    if block_chars <= 0:
        raise ValueError(f"block_chars must be positive, got {block_chars}")
    data = text.encode("utf-8", "surrogatepass")
    n_blocks = len(data) // block_chars
    if max_blocks is not None:
        n_blocks = min(n_blocks, max_blocks)
    digest = xxhash.xxh3_64_intdigest
    out: list[int] = []
    h = 0
    for i in range(n_blocks):
        h = digest(data[i * block_chars : (i + 1) * block_chars], h)
        out.append(h)
    return out
