"""Chained block hashes of a prompt, the key of prefix affinity.

Algorithm: cut `text` (UTF-8 bytes) into consecutive blocks of `block_chars` bytes; only full
blocks count, as an engine only caches full KV blocks. Block i's hash is
`h_i = xxh3_64(block_i, seed=h_{i-1})` with `h_{-1} = 0`, so h_i covers blocks 0..i: equal hashes
mean equal *prefixes*, not merely equal blocks. The digest is stable across processes and
machines (unlike `hash()`), so gateway replicas that share an index through Redis agree on it.

Inputs: the prompt text; `block_chars` (bytes per block: 512 ~= 128 tokens at ~4 chars per
token); `max_blocks` (cap on hashed blocks, bounding the cost of very long prompts).
Cost: one xxh3 call per block, ~0.2-1 us each depending on the machine.

`token_block_hashes` is the same chain over token ids (precise prefix routing, as llm-d keys its
index): block i holds tokens [i*block_size, (i+1)*block_size) packed as little-endian int64, and the
chain starts from `root_seed(lora_name)` (0 for the base model, a digest of the adapter's name
otherwise, because vLLM keys an adapter's blocks apart from the base model's). The gateway hashes a
request's prompt tokens with it and the KV-event subscriber hashes the token ids each `BlockStored`
event carries: equal tokens give equal hashes in every process and on every replica, which the
engines' own block hashes do not guarantee (they depend on `PYTHONHASHSEED` and the engine version).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

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


def root_seed(lora_name: str | None) -> int:
    """The seed of a token-block chain: 0 for the base model, the adapter's own root otherwise."""
    return 0 if not lora_name else xxhash.xxh3_64_intdigest(b"lora:" + lora_name.encode("utf-8", "surrogatepass"))


def token_block_hashes(
    token_ids: Sequence[int], *, block_size: int, seed: int = 0, max_blocks: int | None = None
) -> list[int]:
    """Chained hashes of the full `block_size`-token blocks of `token_ids`, starting from `seed` (a parent
    block's hash, or `root_seed(...)` at the start of a prompt)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    n_blocks = len(token_ids) // block_size
    if max_blocks is not None:
        n_blocks = min(n_blocks, max_blocks)
    if n_blocks == 0:
        return []
    try:
        data = array("q", token_ids[: n_blocks * block_size]).tobytes()
    except OverflowError:
        raise ValueError("token ids must fit in 64 bits") from None
    step = 8 * block_size
    digest = xxhash.xxh3_64_intdigest
    out: list[int] = []
    h = seed
    for i in range(n_blocks):
        h = digest(data[i * step : (i + 1) * step], h)
        out.append(h)
    return out
