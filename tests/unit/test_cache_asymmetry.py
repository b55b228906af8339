"""The residual head's inputs and score (`fleetgate.cache.asymmetry`) on made-up token states, without the model.

Each word's state is a chosen unit vector, so what is checked is the arithmetic: which words count as left
unexplained, that the inputs do not depend on which prompt is `a`, and that the score is bounded."""

from __future__ import annotations

import numpy as np
import pytest

from fleetgate.cache.asymmetry import (
    RESIDUAL_TAU,
    SCORE_RANGE,
    STATE_FEATURES,
    STATE_NEUTRAL,
    ResidualHead,
    residual_inputs,
    side_mass,
    side_residual_inputs,
    side_shares,
    state_features,
)
from fleetgate.cache.tokenalign import ALIGN_FEATURES, Words, content_weight

DIM = 6


def words(*pairs: tuple[str, int]) -> Words:
    """Words whose states are basis vectors: ("story", 0) -> e0. Two words with one index align perfectly."""
    vectors = np.zeros((len(pairs), DIM), dtype=np.float32)
    for row, (_, axis) in enumerate(pairs):
        vectors[row, axis] = 1.0
    return Words([w for w, _ in pairs], vectors, [False] * len(pairs))


BASE = words(("write", 0), ("a", 1), ("story", 2))
ADDED = words(("write", 0), ("a", 1), ("story", 2), ("dialogue", 3), ("only", 4))


def test_only_the_words_the_other_side_does_not_explain_make_the_residual() -> None:
    x = residual_inputs(BASE, ADDED)
    r, d = x[:DIM], x[DIM:]
    w_dialogue, w_only = content_weight("dialogue"), content_weight("only")
    assert w_dialogue > 0 and w_only == 0  # "only" is a function word by frequency: it weighs nothing
    expected = np.zeros(DIM)
    expected[3] = 1.0  # the weighted mean of the unexplained content words: "dialogue" alone
    assert np.allclose(r, expected)
    # d points from the shorter request to the one that adds content
    assert np.allclose(d, ADDED.vectors.mean(axis=0) - BASE.vectors.mean(axis=0))


def test_the_inputs_do_not_depend_on_which_prompt_is_stored() -> None:
    assert np.allclose(residual_inputs(BASE, ADDED), residual_inputs(ADDED, BASE))
    other = words(("compose", 5), ("a", 1), ("tale", 3))
    assert np.allclose(residual_inputs(other, ADDED), residual_inputs(ADDED, other))


def test_a_close_counterpart_explains_a_word() -> None:
    """A word whose best match on the other side is at least RESIDUAL_TAU is explained (a rewording)."""
    near = np.zeros(DIM, dtype=np.float32)
    near[2], near[5] = 1.0, 0.5  # cosine 0.89 with "story"
    near /= np.linalg.norm(near)
    assert float(near[2]) >= RESIDUAL_TAU
    reworded = Words(["write", "a", "tale"], np.stack([np.eye(DIM)[0], np.eye(DIM)[1], near]).astype(np.float32),
                     [False] * 3)
    x = residual_inputs(BASE, reworded)
    assert np.allclose(x, 0.0)  # nothing unexplained on either side, the same amount: no direction either


def test_equal_unexplained_content_on_both_sides_has_no_direction() -> None:
    a = words(("write", 0), ("poem", 2))
    b = words(("write", 0), ("poem", 3))  # "poem" against an orthogonal "poem": each side one word unexplained
    x = residual_inputs(a, b)
    assert np.allclose(x[DIM:], 0.0)
    assert np.allclose(x[:DIM][[2, 3]], [0.5, 0.5])


def test_a_prompt_without_words_gives_zero_inputs() -> None:
    empty = Words([], np.zeros((0, DIM), dtype=np.float32), [])
    assert np.allclose(residual_inputs(empty, ADDED), 0.0)
    assert residual_inputs(empty, ADDED).shape == (2 * DIM,)


def test_the_score_is_the_heads_log_odds_clipped() -> None:
    x = residual_inputs(BASE, ADDED)
    head = ResidualHead(coef=tuple(np.arange(2 * DIM, dtype=float) * 0.1), intercept=0.2)
    assert head.score(x) == pytest.approx(0.2 + float(np.dot(np.arange(2 * DIM) * 0.1, x)))
    huge = ResidualHead(coef=tuple([100.0] * 2 * DIM), intercept=0.0)
    assert huge.score(x) == SCORE_RANGE[1]
    assert ResidualHead(coef=tuple([-100.0] * 2 * DIM), intercept=0.0).score(x) == SCORE_RANGE[0]


def test_state_features_end_with_the_residual_score() -> None:
    head = ResidualHead(coef=tuple([0.3] * 2 * DIM), intercept=-0.1)
    values = state_features(BASE, ADDED, head=head)
    assert len(values) == len(STATE_FEATURES) == len(ALIGN_FEATURES) + 1 == len(STATE_NEUTRAL)
    assert values[-1] == pytest.approx(head.score(residual_inputs(BASE, ADDED)))
    assert state_features(BASE, ADDED)[-1] == 0.0  # a model fitted without a head


def test_a_head_round_trips_and_refuses_other_settings() -> None:
    head = ResidualHead(coef=(0.125, -0.5, 2.0), intercept=0.25)
    assert ResidualHead.from_dict(head.to_dict()) == head
    raw = head.to_dict() | {"tau": RESIDUAL_TAU + 0.1}
    with pytest.raises(ValueError, match="refit"):
        ResidualHead.from_dict(raw)


# -- round 7's asymmetric alignment features (measured, not inputs of the shipped model) -------------------------


def test_side_shares_are_symmetric_and_name_the_side_that_adds() -> None:
    high, low, gap = side_shares(BASE, ADDED)
    assert side_shares(ADDED, BASE) == (high, low, gap)
    # ADDED's content words: write, story, dialogue (only weighs 0); dialogue is unexplained; BASE's all explained
    weights = {w: content_weight(w) for w in ("write", "story", "dialogue")}
    assert high == pytest.approx(weights["dialogue"] / sum(weights.values()))
    assert low == 0.0 and gap == pytest.approx(high)


def test_a_clause_added_on_one_side_raises_the_larger_share() -> None:
    longer = words(("write", 0), ("a", 1), ("story", 2), ("dialogue", 3), ("only", 4), ("villain", 5))
    assert side_shares(BASE, longer)[0] > side_shares(BASE, ADDED)[0] > side_shares(BASE, BASE)[0] == 0.0


def test_a_rewording_on_both_sides_has_no_gap() -> None:
    a = words(("write", 0), ("poem", 2))
    b = words(("write", 0), ("poem", 3))  # each side one unexplained word of one weight
    high, low, gap = side_shares(a, b)
    assert high == low > 0 and gap == 0.0


def test_the_soft_share_grows_with_the_distance_of_the_best_match() -> None:
    near = np.zeros(DIM, dtype=np.float32)
    near[2], near[5] = 1.0, 0.5  # cosine 0.89 with "story": explained at tau 0.75, partly unexplained when soft
    near /= np.linalg.norm(near)
    reworded = Words(["write", "a", "tale"], np.stack([np.eye(DIM)[0], np.eye(DIM)[1], near]).astype(np.float32),
                     [False] * 3)
    assert side_shares(BASE, reworded) == (0.0, 0.0, 0.0)
    soft = side_shares(BASE, reworded, tau=None)
    assert 0.0 < soft[0] < side_shares(BASE, ADDED, tau=None)[0]


def test_side_mass_counts_weight_not_share() -> None:
    high, low, gap = side_mass(BASE, ADDED)
    assert high == pytest.approx(content_weight("dialogue")) and low == 0.0 and gap == pytest.approx(high)
    assert side_mass(ADDED, BASE) == (high, low, gap)


def test_side_features_of_a_prompt_without_words_are_zero() -> None:
    empty = Words([], np.zeros((0, DIM), dtype=np.float32), [])
    assert side_shares(empty, ADDED) == side_mass(ADDED, empty) == (0.0, 0.0, 0.0)
    assert side_residual_inputs(empty, ADDED).shape == (3 * DIM,)
    assert np.allclose(side_residual_inputs(empty, ADDED), 0.0)


def test_side_residual_inputs_keep_the_sides_apart_whichever_is_stored() -> None:
    other = words(("write", 0), ("a", 1), ("fable", 5), ("dialogue", 3), ("only", 4))
    x = side_residual_inputs(BASE, other)
    assert np.allclose(x, side_residual_inputs(other, BASE))
    more, less, d = x[:DIM], x[DIM : 2 * DIM], x[2 * DIM :]
    # other leaves "fable" and "dialogue" unexplained, BASE leaves "story": other first, then BASE
    w_fable, w_dialogue = content_weight("fable"), content_weight("dialogue")
    assert np.allclose(more[[5, 3]], [w_fable / (w_fable + w_dialogue), w_dialogue / (w_fable + w_dialogue)])
    assert np.allclose(less, np.eye(DIM)[2])
    assert np.allclose(d, other.vectors.mean(axis=0) - BASE.vectors.mean(axis=0))
