"""Threshold calibration and routing figures, on synthetic scores and on the shipped artifact's data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetgate.router.tiers.calibration import (
    allowed_misses,
    binomial_cdf,
    routing_metrics,
    share_for_budget,
    threshold_for_recall,
    threshold_for_recall_bound,
    threshold_for_share,
)
from fleetgate.router.tiers.scorer import ScorerArtifact


def test_routing_metrics_on_a_small_example() -> None:
    scores = np.array([0.9, 0.8, 0.3, 0.6, 0.1])
    labels = np.array([1, 1, 1, 0, 0])
    m = routing_metrics(scores, labels, threshold=0.5, cost_small=np.full(5, 1.0), cost_large=np.full(5, 10.0))
    assert m.recall_large == pytest.approx(2 / 3)
    assert m.share_large == pytest.approx(3 / 5)
    assert m.small_to_large == pytest.approx(1 / 2)
    # Three calls at 10 and two at 1, against five at 10.
    assert m.savings == pytest.approx(1 - 32 / 50)


def test_threshold_for_recall_meets_the_target_with_the_fewest_large_calls() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=400)
    scores = np.clip(rng.normal(0.35 + 0.3 * labels, 0.15), 0.001, 0.999)
    for target in (0.8, 0.9, 0.95, 1.0):
        t = threshold_for_recall(scores, labels, target=target)
        m = routing_metrics(scores, labels, threshold=t)
        assert m.recall_large >= target
        # Any higher threshold that changes a decision loses a `large` row below the target.
        higher = np.sort(scores[scores >= t])[0] + 1e-9
        assert routing_metrics(scores, labels, threshold=higher).recall_large < target


def test_binomial_cdf_matches_exact_sums() -> None:
    for n, p in ((10, 0.5), (40, 0.05), (350, 0.05)):
        for k in (0, 1, 3, 9):
            exact = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))
            assert binomial_cdf(k, n=n, p=p) == pytest.approx(exact, rel=1e-9)
    assert binomial_cdf(-1, n=5, p=0.5) == 0.0 and binomial_cdf(5, n=5, p=0.5) == 1.0


def test_allowed_misses_is_the_clopper_pearson_margin() -> None:
    # m misses of n are allowed when P(Bin(n, 1 - target) <= m) <= 1 - confidence, and m + 1 are not.
    for n, confidence in ((352, 0.95), (352, 0.99), (135, 0.9), (1000, 0.99)):
        m = allowed_misses(n=n, target=0.95, confidence=confidence)
        assert binomial_cdf(m, n=n, p=0.05) <= 1 - confidence < binomial_cdf(m + 1, n=n, p=0.05)
        assert m < 0.05 * n  # a margin: fewer misses than the target alone would allow
    assert allowed_misses(n=352, target=0.95, confidence=0.99) < allowed_misses(n=352, target=0.95, confidence=0.9)
    assert allowed_misses(n=20, target=0.95, confidence=0.99) == -1  # too few rows for any guarantee


def test_recall_bound_threshold_keeps_a_margin_over_the_plain_one() -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, size=800)
    scores = np.clip(rng.normal(0.35 + 0.3 * labels, 0.15), 0.001, 0.999)
    n = int(labels.sum())
    plain = threshold_for_recall(scores, labels, target=0.95)
    bound = threshold_for_recall_bound(scores, labels, target=0.95, confidence=0.99)
    assert bound < plain
    recall = routing_metrics(scores, labels, threshold=bound).recall_large
    assert recall == pytest.approx(1 - allowed_misses(n=n, target=0.95, confidence=0.99) / n)
    # With no guarantee possible (too few `large` rows) every `large` row is kept.
    few = np.array([0.2, 0.9, 0.4, 0.1])
    t = threshold_for_recall_bound(few, np.array([1, 1, 0, 0]), target=0.95, confidence=0.99)
    assert routing_metrics(few, np.array([1, 1, 0, 0]), threshold=t).recall_large == 1.0
    with pytest.raises(ValueError):
        threshold_for_recall_bound(few, np.zeros(4), target=0.95, confidence=0.99)


def test_threshold_for_share_on_synthetic_scores() -> None:
    scores = np.linspace(0.01, 0.99, 200)
    for target in (0.0, 0.1, 0.45, 0.6, 1.0):
        t = threshold_for_share(scores, target=target)
        assert float(np.mean(scores >= t)) == pytest.approx(target, abs=0.005)
    with pytest.raises(ValueError):
        threshold_for_share(scores, target=1.5)


@pytest.mark.parametrize("target", [0.3, 0.45, 0.6, 0.8])
def test_calibration_hits_the_target_share_on_the_labelled_data(target: float) -> None:
    artifact = ScorerArtifact.load()
    scores = np.asarray(artifact.full.oos_scores)
    assert len(scores) == len(artifact.labels) == artifact.meta["rows"]
    t = threshold_for_share(scores, target=target)
    assert routing_metrics(scores, np.asarray(artifact.labels), threshold=t).share_large == pytest.approx(
        target, abs=1 / len(scores)
    )


def test_share_for_budget() -> None:
    # mean cost 1 (small) vs 11 (large): half the always-large spend allows (5.5 - 1) / 10 of calls large.
    assert share_for_budget(budget=0.5, cost_small=1.0, cost_large=11.0) == pytest.approx(0.45)
    assert share_for_budget(budget=0.05, cost_small=1.0, cost_large=11.0) == 0.0
    assert share_for_budget(budget=2.0, cost_small=1.0, cost_large=11.0) == 1.0
    with pytest.raises(ValueError):
        share_for_budget(budget=0.0, cost_small=1.0, cost_large=2.0)
