"""The tier router with the real MiniLM embedder (loaded once for this module from the PyPI-packaged model)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from fleetgate.cache.embedding import MiniLMEmbedder as CacheEmbedder
from fleetgate.router.tiers.build import build_tiers
from fleetgate.router.tiers.data import DEFAULT_TRAIN, LabelledPrompt, load_labelled
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
def sample() -> list[LabelledPrompt]:
    rows = load_labelled(DEFAULT_TRAIN)
    return rows[::9]  # 52 rows, both tiers


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


# Written for this test only (in neither the training prompts nor the dev set): the kinds the dev-only scorer
# sent to the small tier on unseen prompts (issue 12), and long texts whose task is easy.
SHORT_HARD = [
    "Prove that 11 divides 10^n + (-1)^(n+1) for every n >= 1.",
    "Show that every odd perfect square is 1 mod 8.",
    "Prove that there are infinitely many primes of the form 6k + 5.",
    "What is the remainder of 2^1000 divided by 13?",
    "How many ways can 10 identical balls go into 4 distinct boxes?",
    "Find all integer solutions of x^2 - y^2 = 45.",
    "Prove that sqrt(6) is irrational.",
    "Is 561 prime? If not, why is it special?",
    "Show that the product of four consecutive integers plus one is a perfect square.",
    "How many subsets of {1, ..., 10} contain no two consecutive numbers?",
    "Prove that a tree with at least two vertices has at least two leaves.",
    "What is the expected number of fixed points of a random permutation of n elements?",
    "Prove that every group of prime order is cyclic.",
    "What are the last three digits of 7^999?",
    "Find the smallest prime p such that p^2 + 2 is also prime.",
    "Show that the sum of the first n cubes is the square of the n-th triangular number.",
]
LONG_EASY = [
    "Fix the spelling in this note and change nothing else:\n\nDear parents, the school libary will be closed "
    "next week while we instal new shelfs and computers. Books that are due during that week can be returned "
    "the following monday without any late fee. Students who need a quiet place to study can use room 12, "
    "which will be open every afternoon untill five. Thank you for your understanding and patience, the "
    "library team.",
    "List the names of the people in this paragraph:\n\nOn Saturday, Maria and her brother Luis drove to the "
    "coast to meet their cousin Ana, who had just moved there with her partner, Tom. They spent the afternoon "
    "walking on the beach, and in the evening their old friend Jorge joined them for dinner at a small "
    "restaurant near the harbour, where the owner, Mrs. Costa, remembered them from years ago.",
    "Summarize this in one sentence:\n\nThe city council has approved a plan to add 40 new bike racks in the "
    "downtown area over the next six months. The racks will be placed near the library, the train station, "
    "the main square and several shopping streets. The project is paid for by a state grant for sustainable "
    "transport, and the council hopes it will encourage more residents to cycle to work and to the shops.",
    "Turn this into a bulleted list without changing the words:\n\nBefore you leave the office on Friday, "
    "please switch off your monitor, close the windows, water the plants on your desk, put any confidential "
    "papers in the locked cabinet, take your mug to the kitchen, and make sure the meeting room is tidy for "
    "Monday's client visit.",
]


async def test_held_out_short_hard_prompts_reach_the_large_tier(minilm: MiniLMEmbedder) -> None:
    """The defect of issue 12: short hard prompts (one-line proofs, number theory, counting) went to the small
    tier on prompts nobody tuned on. Long easy texts must still stay mostly small."""
    r = resolver(minilm)
    hard = [(await r.resolve("auto", f"<|user|>{text}\n")).tier for text in SHORT_HARD]
    easy = [(await r.resolve("auto", f"<|user|>{text}\n")).tier for text in LONG_EASY]
    assert hard.count("large") >= len(SHORT_HARD) - 1, list(zip(SHORT_HARD, hard, strict=True))
    assert easy.count("small") >= len(LONG_EASY) - 1, list(zip(LONG_EASY, easy, strict=True))
