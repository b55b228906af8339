"""`measure_loaded`: the latency run measures the shipped lookup path (the static prefilter first, the
encoder through the batcher only when a candidate survives), one lookup at a time and under open-loop load.

Hashing embedders stand for both models (a 64-dimension one for the static table, as in
test_cache_prefilter), so no model files are needed and the work stays small."""

from __future__ import annotations

import itertools

from fleetgate.cache.config import CacheConfig
from fleetgate.cache.embedding import BatchingEmbedder, HashingEmbedder
from fleetgate.cache.latency import measure_loaded

TOPICS = ["reverse a list", "sort a dictionary by value", "read a file line by line", "parse a date string",
          "merge two lists", "remove duplicates from a list", "make an HTTP request", "format a number"]
LANGUAGES = ["Python", "JavaScript", "Go", "Rust"]
PROMPTS = [f"How do I {t} in {lang}?" for t, lang in itertools.product(TOPICS, LANGUAGES)] + [
    "What is the capital of Australia?", "Write a haiku about autumn rain.", "Convert 100 dollars to yen",
    "Explain photosynthesis to a child.", "Suggest a name for a grey cat.", "Who painted the Mona Lisa?",
    "What is the boiling point of water at sea level?", "Give me a recipe for pancakes.",
]


def config(**semantic: object) -> CacheConfig:
    return CacheConfig.model_validate({"semantic": {"embedder": "hashing", **semantic}})


async def test_the_prefilter_path_runs_single_stream_and_under_load() -> None:
    encoder = BatchingEmbedder(embedder=HashingEmbedder(dim=256))
    run = await measure_loaded(embedder=encoder, prefilter=HashingEmbedder(dim=64), config=config(),
                               prompts=PROMPTS, entries=200, queries=6, loads=(0.5, 0.9), progress=lambda _: None)
    assert run.entries == 200 and run.stored_texts == len(PROMPTS) - 18
    assert [level.name for level in run.levels] == ["single stream", "50%", "90%"]
    capacity = run.levels[0].achieved
    assert run.levels[0].rate == 0 and capacity > 0
    assert [round(level.rate / capacity, 2) for level in run.levels[1:]] == [0.5, 0.9]
    for level in run.levels:
        assert level.lookups == 6 and len(level.lookup.seconds) == 6  # bounded: `queries` per level
        assert {"static", "prefilter"} <= set(level.stages)  # every lookup went through the prefilter
        assert len(level.stages["static"].seconds) == 6
        if level.encoded:
            assert len(level.stages["embed"].seconds) == level.encoded
    encoded = sum(level.encoded for level in run.levels)
    assert 0 < encoded < 18  # some lookups skipped the encoder, some needed it
    assert encoder.batches > 0  # the encodes went through the batcher (`aembed`), as in the gateway
    assert run.levels[0].max_in_flight == 1
    assert {"encoder_ann", "static_ann", "static_recall", "static_text_recall", "static_p99",
            "static_flat_p99"} <= set(run.facts)
    assert run.facts["static_ann"] == 0 and run.facts["static_recall"] == 1.0  # 200 entries: a flat scan


async def test_both_indexes_switch_to_ivf_past_ann_above() -> None:
    run = await measure_loaded(embedder=HashingEmbedder(dim=256), prefilter=HashingEmbedder(dim=64),
                               config=config(ann_above=50, ann_lists=4, ann_probe=4), prompts=PROMPTS, entries=200,
                               queries=4, loads=(),
                               progress=lambda _: None)
    assert [level.name for level in run.levels] == ["single stream"]
    assert run.facts["encoder_ann"] == 1 and run.facts["static_ann"] == 1
    for space in ("static", "encoder"):
        assert 0.0 <= run.facts[f"{space}_recall"] <= 1.0 and 0.0 <= run.facts[f"{space}_text_recall"] <= 1.0


async def test_without_a_prefilter_every_semantic_lookup_encodes() -> None:
    run = await measure_loaded(embedder=HashingEmbedder(dim=256), prefilter=None, config=config(prefilter="off"),
                               prompts=PROMPTS, entries=100, queries=5, loads=(0.5,), progress=lambda _: None)
    for level in run.levels:
        assert level.encoded == level.lookups == 5 and "static" not in level.stages
    assert "static_ann" not in run.facts


async def test_lookup_times_split_by_whether_the_lookup_encoded() -> None:
    run = await measure_loaded(embedder=HashingEmbedder(dim=256), prefilter=HashingEmbedder(dim=64), config=config(),
                               prompts=PROMPTS, entries=200, queries=8, loads=(), progress=lambda _: None)
    level = run.levels[0]
    assert len(level.encoded_lookup.seconds) == level.encoded
    assert len(level.encoded_lookup.seconds) + len(level.skipped_lookup.seconds) == level.lookups == 8
