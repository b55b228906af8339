"""Threshold calibration and routing figures for a two-tier alias.

Inputs: scores in [0, 1] (need for the strong tier), labels (1 = `large`), a threshold `t` (score >= t goes to
the large tier) and, for savings, the estimated cost of one call per row in each tier.
- recall of large  = |{large rows with score >= t}| / |large rows|   (the quality proxy)
- share to large   = |{rows with score >= t}| / |rows|                 (1.0 for always-large)
- savings          = 1 - sum(cost of the routed tier) / sum(cost of the large tier)
Threshold rules:
- for a target recall R: the highest t with recall >= R, lowered half-way to the next lower score (margin);
- for a target recall R with confidence c (`threshold_for_recall_bound`, the shipped calibration): the scores
  are out-of-sample (cross-validated), so a new `large` prompt's score is exchangeable with the n `large`
  scores. Allowing m of them below t, the one-sided Clopper-Pearson bound says the miss rate on new prompts
  is <= 1 - R with confidence c exactly when P(Binomial(n, 1 - R) <= m) <= 1 - c. The largest such m fixes t
  (the (m+1)-th lowest `large` score, lowered half-way to the next lower score): with n = 350 and R = 0.95,
  c = 0.99 this is an out-of-sample recall of ~97.7%, a margin that shrinks as the labelled data grows.
- for a target share S: the (1 - S) quantile of the scores, so that about S of the rows reach the large tier;
- for a budget B (a fraction of the always-large cost): the highest share S whose expected cost
  `S * cost_large + (1 - S) * cost_small <= B * cost_large`, then as for a share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class RoutingMetrics:
    threshold: float
    recall_large: float  # share of `large` prompts that reached the large tier
    share_large: float  # share of all calls that went to the large tier
    small_to_large: float  # share of `small` prompts sent to the large tier (cost loss)
    savings: float | None  # vs always-large at the given costs; None without costs

    @property
    def fewer_large_calls(self) -> float:
        return 1.0 - self.share_large


def routing_metrics(
    scores: np.ndarray, labels: np.ndarray, *, threshold: float,
    cost_small: np.ndarray | None = None, cost_large: np.ndarray | None = None,
) -> RoutingMetrics:
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    to_large = s >= threshold
    savings = None
    if cost_small is not None and cost_large is not None:
        spent = float(np.where(to_large, cost_large, cost_small).sum())
        savings = 1.0 - spent / float(np.sum(cost_large))
    return RoutingMetrics(
        threshold=threshold,
        recall_large=float(to_large[y].mean()) if y.any() else math.nan,
        share_large=float(to_large.mean()),
        small_to_large=float(to_large[~y].mean()) if (~y).any() else math.nan,
        savings=savings,
    )


def threshold_for_recall(scores: np.ndarray, labels: np.ndarray, *, target: float) -> float:
    if not 0 < target <= 1:
        raise ValueError(f"target recall must be in (0, 1], got {target}")
    s = np.asarray(scores, dtype=np.float64)
    positives = np.sort(s[np.asarray(labels).astype(bool)])[::-1]
    if positives.size == 0:
        raise ValueError("no `large` rows to calibrate on")
    need = math.ceil(target * positives.size - 1e-9)
    t = float(positives[need - 1])
    below = s[s < t]
    if below.size:
        t = (t + float(below.max())) / 2
    return min(max(t, 1e-6), 1 - 1e-6)


def binomial_cdf(k: int, *, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), summed in log space (exact enough for n in the thousands)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
        for i in range(k + 1)
    ]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def allowed_misses(*, n: int, target: float, confidence: float) -> int:
    """The most of n out-of-sample `large` scores that may fall below the threshold while the recall on new
    prompts stays >= `target` with `confidence` (one-sided Clopper-Pearson); -1 when even 0 misses cannot."""
    if not 0 < target < 1 or not 0 < confidence < 1:
        raise ValueError(f"target and confidence must be in (0, 1), got {target} and {confidence}")
    m = -1
    while m + 1 < n and binomial_cdf(m + 1, n=n, p=1 - target) <= 1 - confidence:
        m += 1
    return m


def threshold_for_recall_bound(scores: np.ndarray, labels: np.ndarray, *, target: float, confidence: float) -> float:
    """The highest threshold whose recall of `large` on new prompts is >= `target` with `confidence`, from
    out-of-sample `scores`; with too few `large` rows for any guarantee, every scored `large` row is kept."""
    s = np.asarray(scores, dtype=np.float64)
    positives = np.sort(s[np.asarray(labels).astype(bool)])
    if positives.size == 0:
        raise ValueError("no `large` rows to calibrate on")
    misses = max(allowed_misses(n=int(positives.size), target=target, confidence=confidence), 0)
    t = float(positives[misses])
    below = s[s < t]
    if below.size:
        t = (t + float(below.max())) / 2
    return min(max(t, 1e-6), 1 - 1e-6)


def threshold_for_share(scores: np.ndarray, *, target: float) -> float:
    if not 0 <= target <= 1:
        raise ValueError(f"target share must be in [0, 1], got {target}")
    s = np.sort(np.asarray(scores, dtype=np.float64))[::-1]
    k = round(target * s.size)
    if k <= 0:
        return 1 - 1e-6
    if k >= s.size:
        return 1e-6
    # Between the k-th highest score and the next one: exactly k rows (ties aside) reach the large tier.
    return min(max((float(s[k - 1]) + float(s[k])) / 2, 1e-6), 1 - 1e-6)


def share_for_budget(*, budget: float, cost_small: float, cost_large: float) -> float:
    """The highest share of large-tier calls whose mean cost stays within `budget` x always-large."""
    if budget <= 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    if cost_large <= cost_small:
        return 1.0
    share = (budget * cost_large - cost_small) / (cost_large - cost_small)
    return min(max(share, 0.0), 1.0)
