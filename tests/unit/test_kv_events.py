"""Decoding vLLM's KV-event batches: both wire shapes, unknown fields, and garbage that must never crash."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetgate.router.kv_block_index import EndpointBlocks
from fleetgate.router.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventDecodeError,
    decode_batch,
    encode_batch,
)

# Bytes vLLM 0.26.0's own `KVEventBatch` encoder (msgspec, tagged-map events) produced for GOLDEN_EVENTS, with
# data_parallel_rank 0 and ts 1.5; vLLM 0.32's encoder produces the same bytes for these fields.
GOLDEN_MAP = bytes.fromhex(
    "93cb3ff8000000000000948aa474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920b16b1706172656e74"
    "5f626c6f636b5f68617368c0a9746f6b656e5f696473980001020304050607aa626c6f636b5f73697a6504a76c6f72615f6964c0"
    "a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64"
    "ae66756c6c5f617474656e74696f6e8aa474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739121b1706172"
    "656e745f626c6f636b5f6861736816a9746f6b656e5f6964739408090a0baa626c6f636b5f73697a6504a76c6f72615f6964c0a6"
    "6d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae"
    "66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739121a66d6564"
    "69756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400"
)
# The same events from the same struct declared `array_like=True` (the tagged-array shape of older vLLM).
GOLDEN_ARRAY = bytes.fromhex(
    "93cb3ff8000000000000949dab426c6f636b53746f726564920b16c098000102030405060704c0a3475055c0c000ae66756c6c5f"
    "617474656e74696f6ec0c09dab426c6f636b53746f7265649121169408090a0b04c0a3475055c0c000ae66756c6c5f617474656e"
    "74696f6ec0c095ac426c6f636b52656d6f7665649121a347505500c091b0416c6c426c6f636b73436c656172656400"
)
GOLDEN_EVENTS = (
    BlockStored(block_hashes=(11, 22), parent_block_hash=None, token_ids=tuple(range(8)), block_size=4,
                medium="GPU", group_idx=0, spec_kind="full_attention"),
    BlockStored(block_hashes=(33,), parent_block_hash=22, token_ids=(8, 9, 10, 11), block_size=4, medium="GPU",
                group_idx=0, spec_kind="full_attention"),
    BlockRemoved(block_hashes=(33,), medium="GPU", group_idx=0),
    AllBlocksCleared(),
)


@pytest.mark.parametrize("payload", [GOLDEN_MAP, GOLDEN_ARRAY], ids=["tagged-map", "tagged-array"])
def test_vllm_payloads_of_both_shapes_decode_to_the_same_events(payload: bytes) -> None:
    batch = decode_batch(payload)
    assert batch.ts == 1.5 and batch.data_parallel_rank == 0 and batch.skipped == 0
    assert batch.events == GOLDEN_EVENTS


def test_unknown_fields_and_event_types_are_ignored() -> None:
    stored = {"type": "BlockStored", "block_hashes": [b"\x01" * 32], "parent_block_hash": None,
              "token_ids": [1, 2], "block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": None,
              "ownership": "x", "session_id": "s-1", "locality": "LOCAL", "a_field_from_2027": {"nested": [1]}}
    payload = msgpack.packb([2.0, [stored, {"type": "BlockTeleported", "block_hashes": [1]}]], use_bin_type=True)
    batch = decode_batch(payload)
    assert batch.skipped == 1
    assert batch.events == (BlockStored(block_hashes=(b"\x01" * 32,), parent_block_hash=None, token_ids=(1, 2),
                                        block_size=2, medium="GPU"),)
    # An old six-field array event with trailing items from a newer version.
    old = ["BlockStored", [7], None, [5, 6], 2, None, "GPU", None, None, 3, "full_attention", None, "extra", 9]
    batch = decode_batch(msgpack.packb([1, [old, ["BlockRemoved", [7], None]]]))
    assert batch.events == (BlockStored(block_hashes=(7,), parent_block_hash=None, token_ids=(5, 6), block_size=2,
                                        medium="GPU", group_idx=3, spec_kind="full_attention"),
                            BlockRemoved(block_hashes=(7,)))


@pytest.mark.parametrize("event", [
    {"type": "BlockStored", "block_hashes": [True], "parent_block_hash": None, "token_ids": [1], "block_size": 1},
    {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": "p", "token_ids": [1], "block_size": 1},
    {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1.5], "block_size": 1},
    {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [3, False], "block_size": 2},
    {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": [1, "2"], "block_size": 1},
    {"type": "BlockStored", "block_hashes": [1, True], "parent_block_hash": None, "token_ids": [1, 2], "block_size": 1},
    {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1], "block_size": 0},
    {"type": "BlockStored", "block_hashes": 1, "parent_block_hash": None, "token_ids": [1], "block_size": 1},
    {"type": "BlockRemoved", "block_hashes": [None]},
    ["BlockStored", [1]],
    42,
    [],
], ids=repr)
def test_a_malformed_event_is_skipped_not_the_batch(event: Any) -> None:
    # (bools are ints to Python, not to msgpack: a token id or hash that is one is malformed, also among ints)
    good = {"type": "AllBlocksCleared"}
    batch = decode_batch(msgpack.packb([0.0, [event, good]]))
    assert batch.events == (AllBlocksCleared(),)
    assert batch.skipped == 1 and batch.notes


@pytest.mark.parametrize("payload", [
    b"", b"\xc1", b"\x93\x01", msgpack.packb({"ts": "x"}), msgpack.packb([1.0]), msgpack.packb([1.0, "events"]),
    msgpack.packb([True, []]), msgpack.packb("batch"), msgpack.packb([1.0, []]) + b"trailing",
], ids=repr)
def test_garbage_payloads_raise_the_decode_error(payload: bytes) -> None:
    with pytest.raises(KvEventDecodeError):
        decode_batch(payload)


def test_an_oversized_payload_is_refused_before_unpacking() -> None:
    with pytest.raises(KvEventDecodeError, match="exceeds"):
        decode_batch(msgpack.packb([1.0, [{"type": "AllBlocksCleared"}] * 100]), max_payload_bytes=64)


_stored = st.builds(
    lambda hashes, parent, size, lora, group: BlockStored(
        block_hashes=tuple(hashes), parent_block_hash=parent, token_ids=tuple(range(size * len(hashes))),
        block_size=size, lora_name=lora, medium="GPU", group_idx=group),
    st.lists(st.integers(0, 2**64 - 1) | st.binary(min_size=1, max_size=32), max_size=4),
    st.none() | st.integers(0, 2**64 - 1), st.integers(1, 8), st.none() | st.text(max_size=8),
    st.none() | st.integers(0, 5),
)
_events = st.lists(_stored | st.builds(lambda h: BlockRemoved(block_hashes=tuple(h), medium="GPU"),
                                       st.lists(st.integers(0, 2**64 - 1), max_size=4))
                   | st.just(AllBlocksCleared()), max_size=6)


@settings(max_examples=150, deadline=None)
@given(events=_events, shape=st.sampled_from(["map", "array"]))
def test_encode_then_decode_round_trips(events: list[Any], shape: str) -> None:
    assert decode_batch(encode_batch(events, ts=3.0, shape=shape)).events == tuple(events)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=st.binary(max_size=512))
def test_random_bytes_never_crash_the_decoder(payload: bytes) -> None:
    try:
        batch = decode_batch(payload)
    except KvEventDecodeError:
        return
    EndpointBlocks().apply(batch)


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=12)
    | st.binary(max_size=12) | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type"]),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(
        st.sampled_from(["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "group_idx",
                         "medium", "lora_name", "extra_keys", "kv_cache_spec_kind", "other"]), children, max_size=6),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ts=st.floats(allow_nan=False) | st.integers(0, 10), events=st.lists(_values, max_size=6))
def test_structured_garbage_decodes_or_errors_and_applies_safely(ts: float, events: list[Any]) -> None:
    """Well-formed msgpack of the right outline but arbitrary content: events are kept or skipped, and the
    block index takes whatever decodes without raising."""
    payload = msgpack.packb([ts, events], use_bin_type=True)
    try:
        batch = decode_batch(payload)
    except KvEventDecodeError:
        return
    assert len(batch.events) + batch.skipped == len(events)
    blocks = EndpointBlocks()
    blocks.apply(batch)
    assert len(blocks) <= len(blocks.ours_of)
