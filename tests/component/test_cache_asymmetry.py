"""The residual head (issue 30) with the real MiniLM: what it costs a lookup that misses, and what it catches.

`bench gateway`'s varied misses ("How do I merge JSON records in Go without a library?") reach the pair model
with two-sided differences; the bound without token states (`verifier.judge_without_alignment`) must still
settle them, as it did before the head, or every such miss would group token states (and a misspelt one pay
an encoder pass of its own). A request that only adds a constraint must not be served the plain request's
answer, whichever of the two was stored first.
"""

from __future__ import annotations

import numpy as np
import pytest

from fleetgate.bench.loadgen import varied_prompt
from fleetgate.cache.build import build_embedder
from fleetgate.cache.config import CacheConfig
from fleetgate.cache.embedding import encoder_of
from fleetgate.cache.textnorm import embedding_text
from fleetgate.cache.verifier import Pending, judge_without_alignment, precheck, verify

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def encoder() -> object:
    return encoder_of(build_embedder(CacheConfig()))


def test_the_varied_misses_are_settled_without_token_states(encoder: object) -> None:
    prompts = [varied_prompt(n) for n in range(1, 301)]
    vectors = encoder.embed([embedding_text(p) for p in prompts])  # type: ignore[attr-defined]
    sims = vectors @ vectors.T
    reached = settled = 0
    for i in range(1, len(prompts)):
        j = int(np.argmax(sims[i, :i]))  # the nearest earlier prompt: the candidate a lookup verifies
        step = precheck(prompts[j], prompts[i])
        if not isinstance(step, Pending):
            continue
        reached += 1
        verdict = judge_without_alignment(step, similarity=float(sims[i, j]))
        settled += verdict is not None and not verdict.ok
    assert reached >= 200  # the workload is what the pair model judges
    assert settled >= 0.95 * reached


ADDED = [
    ("Write a fable about a fox and a crow.", "Write a fable about a fox and a crow, set in a modern office."),
    ("How do I make hummus?", "How do I make hummus without a food processor?"),
    ("Plan a day trip to the coast.", "Plan a day trip to the coast that works by public transport."),
    ("Explain how a refrigerator works.", "Explain how a refrigerator works, using a single analogy."),
]


@pytest.mark.parametrize(("plain", "constrained"), ADDED)
def test_an_added_constraint_is_refused_either_way_round(encoder: object, plain: str, constrained: str) -> None:
    a, b = encoder.embed([embedding_text(plain), embedding_text(constrained)])  # type: ignore[attr-defined]
    similarity = float(a @ b)
    assert similarity >= CacheConfig().semantic.threshold  # the similarity gate lets the pair through
    assert not verify(plain, constrained, similarity=similarity).ok
    assert not verify(constrained, plain, similarity=similarity).ok
