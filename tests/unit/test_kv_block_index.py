"""The per-engine block set rebuilt from KV events, keyed by FleetGate's own token-block hashes."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from fleetgate.router.hashing import root_seed, token_block_hashes
from fleetgate.router.kv_block_index import EndpointBlocks
from fleetgate.router.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KvEvent

BS = 4


def batch(*events: KvEvent) -> EventBatch:
    return EventBatch(ts=0.0, events=tuple(events))


def stored_chain(tokens: Sequence[int], engine_hashes: Sequence[int], *, cuts: Sequence[int] = (),
                 lora: str | None = None, group: int | None = 0, kind: str | None = "full_attention",
                 medium: str = "GPU") -> list[BlockStored]:
    """What an engine publishes for `tokens` (full blocks only), split into one event per run between `cuts`."""
    n = len(tokens) // BS
    bounds = [0, *cuts, n]
    out = []
    for start, end in itertools.pairwise(bounds):
        out.append(BlockStored(
            block_hashes=tuple(engine_hashes[start:end]), parent_block_hash=engine_hashes[start - 1] if start else None,
            token_ids=tuple(tokens[start * BS:end * BS]), block_size=BS, lora_name=lora, medium=medium,
            group_idx=group, spec_kind=kind))
    return out


def engine_hashes(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)  # each replica names blocks its own way (PYTHONHASHSEED, sha256 of its own inputs)
    return [rng.getrandbits(64) for _ in range(n)]


PROMPT = list(range(1000, 1042))  # 10 full blocks of 4 tokens and 2 tokens over


def test_two_replicas_with_different_engine_hashes_agree_on_our_hashes() -> None:
    request = token_block_hashes(PROMPT, block_size=BS)
    a, b = EndpointBlocks(), EndpointBlocks()
    a.apply(batch(*stored_chain(PROMPT, engine_hashes(10, 1), cuts=(3, 6))))
    b.apply(batch(*stored_chain(PROMPT, engine_hashes(10, 2), cuts=(5,))))
    assert a.match(request) == b.match(request) == 10 == len(a) == len(b)
    other = PROMPT[:20] + [7] * 22  # shares the first 5 blocks
    assert a.match(token_block_hashes(other, block_size=BS)) == 5
    assert a.block_size == BS


def test_hashes_chain_over_the_whole_prefix() -> None:
    """Equal blocks after different prefixes are different blocks (as in vLLM)."""
    x = token_block_hashes([1, 2, 3, 4, 5, 6, 7, 8], block_size=BS)
    y = token_block_hashes([9, 9, 9, 9, 5, 6, 7, 8], block_size=BS)
    assert x[1] != y[1]
    assert token_block_hashes([1, 2, 3], block_size=BS) == []
    assert token_block_hashes(PROMPT, block_size=BS, max_blocks=3) == token_block_hashes(PROMPT, block_size=BS)[:3]
    continued = token_block_hashes(PROMPT[8:], block_size=BS, seed=token_block_hashes(PROMPT, block_size=BS)[1])
    assert continued == token_block_hashes(PROMPT, block_size=BS)[2:]


def test_a_block_whose_parent_is_unknown_is_an_orphan() -> None:
    blocks = EndpointBlocks()
    events = stored_chain(PROMPT, engine_hashes(10, 1), cuts=(4,))
    counts = blocks.apply(batch(events[1]))  # the first event was never seen
    assert counts.orphaned == 6 and len(blocks) == 0
    assert blocks.match(token_block_hashes(PROMPT, block_size=BS)) == 0


def test_removal_cuts_the_prefix_and_other_media_keep_a_block() -> None:
    hashes = engine_hashes(10, 1)
    blocks = EndpointBlocks()
    blocks.apply(batch(*stored_chain(PROMPT, hashes)))
    blocks.apply(batch(*stored_chain(PROMPT[:12], hashes[:3], medium="CPU")))  # offloaded copies of blocks 0-2
    blocks.apply(batch(BlockRemoved(block_hashes=(hashes[4],), medium="GPU", group_idx=0)))
    request = token_block_hashes(PROMPT, block_size=BS)
    assert blocks.match(request) == 4
    blocks.apply(batch(BlockRemoved(block_hashes=tuple(hashes[:3]), medium="GPU", group_idx=0)))
    assert blocks.match(request) == 4  # blocks 0-2 still held on the CPU tier, 3 on the GPU
    blocks.apply(batch(BlockRemoved(block_hashes=(hashes[1],), medium="CPU", group_idx=0)))
    assert blocks.match(request) == 1
    blocks.apply(batch(AllBlocksCleared()))
    assert len(blocks) == 0 and blocks.match(request) == 0 and not blocks.ours_of and not blocks.media


def test_storing_twice_is_idempotent() -> None:
    hashes = engine_hashes(10, 1)
    blocks = EndpointBlocks()
    events = stored_chain(PROMPT, hashes)
    blocks.apply(batch(*events, *events))
    assert len(blocks) == 10 and all(v == 1 for v in blocks.held.values())
    blocks.apply(batch(BlockRemoved(block_hashes=tuple(hashes), medium="GPU", group_idx=0)))
    assert len(blocks) == 0


def test_an_adapters_blocks_are_apart_from_the_base_models() -> None:
    blocks = EndpointBlocks()
    blocks.apply(batch(*stored_chain(PROMPT, engine_hashes(10, 1), lora="sql-lora")))
    assert blocks.match(token_block_hashes(PROMPT, block_size=BS)) == 0
    assert blocks.match(token_block_hashes(PROMPT, block_size=BS, seed=root_seed("sql-lora"))) == 10
    assert root_seed(None) == 0 and root_seed("a") != root_seed("b")


def test_blocks_hashed_with_inputs_the_gateway_lacks_are_not_claimed() -> None:
    hashes = engine_hashes(3, 1)
    tokens = PROMPT[:12]
    salted = BlockStored(block_hashes=tuple(hashes), parent_block_hash=None, token_ids=tuple(tokens), block_size=BS,
                         lora_name="a", medium="GPU", group_idx=0, extra_keys=(("a",), ("a", "salt-1"), None))
    blocks = EndpointBlocks()
    counts = blocks.apply(batch(salted))
    assert counts.stored == 1 and counts.skipped == 2
    assert blocks.match(token_block_hashes(tokens, block_size=BS, seed=root_seed("a"))) == 1


def test_the_full_attention_group_is_followed() -> None:
    """As Gemma 3 on vLLM CPU publishes: the same blocks for five sliding-window groups and one full one."""
    hashes = engine_hashes(10, 1)
    blocks = EndpointBlocks()
    events = [e for g in range(5) for e in stored_chain(PROMPT, hashes, group=g, kind="sliding_window")]
    blocks.apply(batch(*events, *stored_chain(PROMPT, hashes, group=5, kind="full_attention")))
    assert blocks.group == 5 and len(blocks) == 10
    blocks.apply(batch(BlockRemoved(block_hashes=(hashes[0],), medium="GPU", group_idx=0)))  # a sliding group's
    assert blocks.match(token_block_hashes(PROMPT, block_size=BS)) == 10
    blocks.apply(batch(BlockRemoved(block_hashes=(hashes[0],), medium="GPU", group_idx=5)))
    assert blocks.match(token_block_hashes(PROMPT, block_size=BS)) == 0


def test_an_engine_that_does_not_name_kinds_is_followed_on_group_zero() -> None:
    hashes = engine_hashes(10, 1)
    blocks = EndpointBlocks()
    blocks.apply(batch(*stored_chain(PROMPT, hashes, group=1, kind=None)))
    assert len(blocks) == 0 and blocks.group is None
    blocks.apply(batch(*stored_chain(PROMPT, hashes, group=0, kind=None)))
    assert len(blocks) == 10 and blocks.group == 0
    pinned = EndpointBlocks(group=1)
    pinned.apply(batch(*stored_chain(PROMPT, hashes, group=1, kind="sliding_window")))
    assert len(pinned) == 10
    ungrouped = EndpointBlocks()
    ungrouped.apply(batch(*stored_chain(PROMPT, hashes, group=None, kind=None)))
    ungrouped.apply(batch(BlockRemoved(block_hashes=(hashes[9],), medium="GPU")))
    assert len(ungrouped) == 9


def test_other_block_sizes_and_short_token_lists_are_skipped() -> None:
    blocks = EndpointBlocks()
    blocks.apply(batch(*stored_chain(PROMPT, engine_hashes(10, 1))))
    partial = BlockStored(block_hashes=(5,), parent_block_hash=None, token_ids=(1, 2), block_size=2, medium="GPU",
                          group_idx=0)
    short = BlockStored(block_hashes=(6, 7), parent_block_hash=None, token_ids=(1, 2, 3, 4), block_size=BS,
                        medium="GPU", group_idx=0)
    counts = blocks.apply(batch(partial, short))
    assert counts.skipped == 3 and len(blocks) == 10


def test_past_max_blocks_the_set_is_cleared_not_grown() -> None:
    blocks = EndpointBlocks(max_blocks=5)
    blocks.apply(batch(*stored_chain(PROMPT, engine_hashes(10, 1))))
    assert len(blocks) == 0 and blocks.overflows == 1
