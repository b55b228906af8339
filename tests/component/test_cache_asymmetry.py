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


# round 7's asymmetric shares on real token states (`asymmetry.side_shares`; measured, not a model input)
WRAPPED = [
    ("How do I rename a git branch?",
     "Hi there, hope you're well! Quick question: how do I rename a git branch? Thanks!"),
    ("What is the boiling point of water?", "Sorry if this is basic, but what is the boiling point of water?"),
]


def _shares(a: str, b: str) -> tuple[float, float, float]:
    from fleetgate.cache.asymmetry import side_shares
    from fleetgate.cache.verifier import default_states

    states = default_states()
    return side_shares(states.words(a), states.words(b))


@pytest.mark.parametrize(("plain", "constrained"), ADDED)
def test_an_added_clause_gives_one_side_unexplained_content(plain: str, constrained: str) -> None:
    high, low, gap = _shares(plain, constrained)
    assert _shares(constrained, plain) == pytest.approx((high, low, gap))
    assert high >= 0.10 and low == 0.0 and gap == high  # the clause is unexplained on its side only


@pytest.mark.parametrize(("plain", "wrapped"), WRAPPED)
def test_a_courtesy_wrapper_gives_a_share_like_an_added_clause(plain: str, wrapped: str) -> None:
    """Why the shares were not shipped (round 7): they measure that one side adds words, not what the words
    say. A wrapper's greetings and thanks are as unexplained as a constraint's clause ("Hi there, hope you're
    well! ... Thanks!" 0.24, "Sorry if this is basic, but" 0.36, against 0.11-0.43 for the clauses above), so a
    model cannot tell the two apart by the share; the residual head, which reads the words' states, can."""
    shares = sorted(_shares(p, c)[0] for p, c in ADDED)
    high, low, _ = _shares(plain, wrapped)
    assert low == 0.0 and shares[0] < high < shares[-1]
