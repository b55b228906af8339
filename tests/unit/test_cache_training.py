"""Fitting the pair model: the lookup's gates, the threshold rule and cross-validation, on hand-written rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetgate.cache import training
from fleetgate.cache.evaluation import Score
from fleetgate.cache.pairfeatures import FEATURES


def _vectors(sims: dict[tuple[str, str], float]) -> dict[str, np.ndarray]:
    """Unit vectors whose dot product within each pair is the given similarity (pairs share no text)."""
    out: dict[str, np.ndarray] = {}
    for (a, b), s in sims.items():
        out[a] = np.array([1.0, 0.0])
        out[b] = np.array([s, math.sqrt(1 - s * s)])
    return out


def _row(a: str, b: str, same: bool, kind: str) -> dict[str, object]:
    return {"a": a, "b": b, "same": same, "kind": kind}


def _conv(history_a: str, history_b: str, last_a: str, last_b: str, same: bool) -> dict[str, object]:
    def conv(h: str, last: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": h}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": last}]
    return {"conv_a": conv(history_a, last_a), "conv_b": conv(history_b, last_b), "same": same, "kind": "x"}


def test_featurize_applies_the_lookup_gates() -> None:
    rows = [
        _row("How do I rename a git branch?", "how do i renmae a git branch", True, "typo"),  # nothing left over
        _row("What is 15% of 80?", "What is 25% of 80?", False, "number"),  # vetoed
        _row("How do I bake bread?", "How do I knead dough by hand?", False, "unrelated"),  # below the threshold
        _row("What are good stretches for back pain?", "Which exercises relieve an aching back?", True, "paraphrase"),
    ]
    convs = [_conv("I use Windows.", "I use macOS.", "How do I take a screenshot?", "How do I take a screenshot?",
                   False)]
    sims = {(r["a"], r["b"]): s for r, s in zip(rows, (0.9, 0.97, 0.4, 0.8), strict=True)}  # type: ignore[misc]
    vectors = _vectors(sims)
    vectors["How do I take a screenshot?"] = np.array([1.0, 0.0])
    items = training.examples(rows, source="t pairs") + training.examples(convs, source="t conversations")
    data = training.featurize(items, vectors, threshold=0.5)
    assert data.accepted.tolist() == [True, False, False, False, False]  # the other history: another partition
    assert data.candidate.tolist() == [False, False, False, True, False]
    assert data.x.shape == (5, len(FEATURES)) and data.x[3, FEATURES.index("similarity")] == pytest.approx(0.8)
    assert [ex.conversation for ex in items] == [False, False, False, False, True]


def test_the_lower_bound_needs_hits_to_vouch_for_precision() -> None:
    assert training.precision_lower_bound(Score(hits=0)) == 0.0
    perfect = Score(hits=300, true_hits=300)
    assert training.precision_lower_bound(perfect) == pytest.approx((1 - training.CONFIDENCE) ** (1 / 300))
    assert training.precision_lower_bound(Score(hits=10, true_hits=10)) < 0.98 < training.precision_lower_bound(
        perfect)


def _featurized(y: list[bool]) -> training.Featurized:
    n = len(y)
    items = tuple(training.Example(a=f"a{i}", b=f"b{i}", same=s, kind="k", source="s", shares_partition=True)
                  for i, s in enumerate(y))
    return training.Featurized(examples=items, x=np.zeros((n, len(FEATURES))), y=np.array(y),
                               candidate=np.ones(n, dtype=bool), accepted=np.zeros(n, dtype=bool))


def test_the_threshold_is_the_lowest_point_whose_bound_meets_the_target() -> None:
    # 400 positives at 0.9, 10 negatives at 0.8: up to 0.80 they cut the bound under 98%
    y = [True] * 400 + [False] * 10
    probs = np.array([0.9] * 400 + [0.8] * 10)
    assert training.choose_threshold(_featurized(y), probs) == 0.81
    # with no threshold meeting it (too few hits), the highest grid point
    assert training.choose_threshold(_featurized([True] * 5), np.full(5, 0.9)) == training.THRESHOLD_GRID[-1]


def test_fit_learns_and_cross_validates_a_separable_problem() -> None:
    rng = np.random.default_rng(0)
    n = 600  # 300 positives: enough hits for the precision bound to clear 98%
    y = np.arange(n) % 2 == 0
    data = _featurized(y.tolist())
    data.x[:, FEATURES.index("similarity")] = np.where(y, 0.9, 0.6) + rng.normal(0, 0.02, n)
    data.x[:, FEATURES.index("one_to_one")] = np.where(y, 0.0, 1.0)
    model, probs = training.fit(data, folds=3, repeats=1)
    assert model.info["cv_precision"] == 1.0 and model.info["cv_recall"] == 1.0
    assert ((probs >= model.threshold) == y).all()
    assert model.probability(data.x[0].tolist()) > model.threshold > model.probability(data.x[1].tolist())


def test_a_given_threshold_is_shipped_and_the_rules_choice_recorded() -> None:
    rng = np.random.default_rng(0)
    n = 600
    y = np.arange(n) % 2 == 0
    data = _featurized(y.tolist())
    data.x[:, FEATURES.index("similarity")] = np.where(y, 0.9, 0.6) + rng.normal(0, 0.02, n)
    ruled, _ = training.fit(data, folds=3, repeats=1)
    given, _ = training.fit(data, folds=3, repeats=1, threshold=0.97)
    assert given.threshold == 0.97 and given.info["threshold_rule"] == ruled.threshold != 0.97
    assert "threshold_rule" not in ruled.info
    assert given.coef == ruled.coef  # the threshold never changes the weights


def test_extra_columns_are_fitted_under_their_names_and_signs() -> None:
    rng = np.random.default_rng(2)
    n = 300
    y = rng.random(n) < 0.5
    names = (*FEATURES, "asym_share_gap")
    x = np.zeros((n, len(names)))
    x[:, FEATURES.index("similarity")] = np.where(y, 0.9, 0.6) + rng.normal(0, 0.05, n)
    x[:, -1] = np.where(y, 0.6, 0.1) + rng.normal(0, 0.05, n)  # against its declared sign (-1): dropped
    model = training.fit_model(x, y, threshold=0.5, names=names)
    assert model.features == names and model.coef[-1] == 0.0 and model.coef[FEATURES.index("similarity")] > 0
    x[:, -1] = np.where(y, 0.1, 0.6) + rng.normal(0, 0.05, n)  # with it: kept
    assert training.fit_model(x, y, threshold=0.5, names=names).coef[-1] < 0


def test_folds_keep_rows_that_share_a_prompt_together() -> None:
    items = [training.Example(a=a, b=b, same=True, kind="k", source="s", shares_partition=True) for a, b in (
        ("What is X?", "what is x"), ("What is x", "Explain X."), ("Explain X", "Define Y."), ("Unrelated?", "Other."))]
    g = training.groups(items)
    assert g[0] == g[1] == g[2] != g[3]  # punctuation and case do not hide a shared prompt; sharing is transitive


def test_sign_constrained_fit_drops_an_alignment_feature_of_the_wrong_sign() -> None:
    rng = np.random.default_rng(1)
    n = 200
    y = rng.random(n) < 0.5
    x = np.zeros((n, len(FEATURES)))
    x[:, FEATURES.index("similarity")] = np.where(y, 0.9, 0.6) + rng.normal(0, 0.05, n)
    x[:, FEATURES.index("align_mean")] = np.where(y, 0.3, 0.8) + rng.normal(0, 0.05, n)  # backwards on purpose
    model = training.fit_model(x, y, threshold=0.5)
    assert model.coef[FEATURES.index("align_mean")] == 0.0
    assert model.coef[FEATURES.index("similarity")] > 0


def _with_residual(y: np.ndarray, residual: np.ndarray) -> training.Featurized:
    data = _featurized(y.tolist())
    return training.Featurized(examples=data.examples, x=data.x, y=data.y, candidate=data.candidate,
                               accepted=data.accepted, residual=residual)


def test_fit_stacks_a_residual_head_that_carries_the_only_signal() -> None:
    """The surface features say nothing here; the residual inputs separate the classes along one direction.
    The fitted model must hold a head, weigh its score, and get the rows right out of fold."""
    rng = np.random.default_rng(2)
    n, width = 600, 16
    y = np.arange(n) % 2 == 0
    direction = rng.normal(size=width)
    direction /= np.linalg.norm(direction)
    residual = rng.normal(0, 0.05, (n, width)) + np.where(y, 0.3, -0.3)[:, None] * direction
    data = _with_residual(y, residual)
    model, _ = training.fit(data, folds=3, repeats=1)
    assert model.head is not None and len(model.head.coef) == width
    assert model.coef[FEATURES.index("align_residual")] > 0
    assert model.info["cv_recall"] > 0.95 and model.info["cv_precision"] == 1.0
    x = data.x[0].copy()
    x[FEATURES.index("align_residual")] = model.head.score(residual[0])
    assert model.probability(x.tolist()) > model.threshold
    x[FEATURES.index("align_residual")] = model.head.score(residual[1])
    assert model.probability(x.tolist()) < model.threshold


def test_cross_validation_refits_the_head_so_held_out_labels_never_reach_it() -> None:
    """Labels unrelated to inputs: a head fitted on all rows would score its own rows well (it memorises 300
    random directions in 128 dimensions); refitted per fold, the out-of-fold probabilities are no better than
    chance."""
    rng = np.random.default_rng(3)
    n, width = 300, 128
    y = rng.random(n) < 0.5
    data = _with_residual(y, rng.normal(size=(n, width)))
    everything = training.fit_head(data.residual, y)  # type: ignore[arg-type]
    in_sample = np.array([everything.score(r) for r in data.residual])  # type: ignore[union-attr]
    assert ((in_sample > 0) == y).mean() > 0.75
    probs = training.out_of_fold(data, folds=5, repeats=1)
    assert 0.3 < ((probs > 0.5) == y).mean() < 0.7
