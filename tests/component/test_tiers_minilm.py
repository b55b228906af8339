"""The tier router with the real MiniLM embedder (loaded once for this module from the PyPI-packaged model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fleetgate.cache.embedding import MiniLMEmbedder as CacheEmbedder
from fleetgate.router.tiers.build import build_tiers
from fleetgate.router.tiers.data import LabelledPrompt, load_labelled
from fleetgate.router.tiers.embedding import MiniLMEmbedder
from fleetgate.router.tiers.resolver import TieredResolver
from fleetgate.router.tiers.scorer import ScorerArtifact

pytestmark = pytest.mark.slow

ALIAS = {"tiers": [{"name": "small", "model": "m-small"}, {"name": "large", "model": "m-large"}]}


@pytest.fixture(scope="module")
def minilm() -> Iterator[MiniLMEmbedder]:
    embedder = MiniLMEmbedder()
    embedder.embed(["warm up"])
    yield embedder


@pytest.fixture(scope="module")
def sample(eval_data_dir: Path) -> list[LabelledPrompt]:
    rows = load_labelled(eval_data_dir / "tier_queries.dev.jsonl")
    return rows[::6]  # 50 rows, both tiers


def resolver(embedder: MiniLMEmbedder) -> TieredResolver:
    built = build_tiers({"aliases": {"auto": ALIAS}}, embedder=embedder)
    assert isinstance(built, TieredResolver)
    return built


async def test_served_decisions_match_the_labels_they_were_trained_on(
    minilm: MiniLMEmbedder, sample: list[LabelledPrompt]
) -> None:
    """In-sample agreement: the serving path (embedding in a thread, features, artifact) reproduces training."""
    r = resolver(minilm)
    decisions = [await r.resolve("auto", f"<|system|>Be helpful.\n<|user|>{row.text}\n") for row in sample]
    assert all(d.reason == "score" for d in decisions)
    large = [d.tier == "large" for d in decisions]
    labels = [row.large for row in sample]
    recall = sum(a and b for a, b in zip(large, labels, strict=True)) / sum(labels)
    accuracy = sum(a == b for a, b in zip(large, labels, strict=True)) / len(labels)
    assert recall >= 0.95 and accuracy >= 0.9


async def test_the_cache_embedding_is_reused_as_is(minilm: MiniLMEmbedder, sample: list[LabelledPrompt]) -> None:
    """The semantic cache embeds the last user message with the same model: passing its vector must give the
    decision the router would compute itself, without computing anything."""
    cache_vectors = CacheEmbedder().embed([row.text for row in sample[:10]])
    computed = resolver(minilm)
    reused = TieredResolver(
        config=computed._config, scorer=computed._scorer, embedder=None  # no embedder: it must reuse
    )
    for row, vector in zip(sample[:10], cache_vectors, strict=True):
        chat = f"<|user|>{row.text}\n"
        mine, theirs = await computed.resolve("auto", chat), await reused.resolve("auto", chat, embedding=vector)
        assert theirs.reason == "score"
        assert mine.tier == theirs.tier
        assert mine.score == pytest.approx(theirs.score, abs=1e-4)


def test_embeddings_are_unit_vectors_of_the_expected_size(minilm: MiniLMEmbedder) -> None:
    vectors = minilm.embed(["hello", "Prove that there are infinitely many primes."])
    assert vectors.shape == (2, ScorerArtifact.load().full.weights.shape[0] - 10)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
