"""Threshold calibration and routing figures for a two-tier alias.

Inputs: scores in [0, 1] (need for the strong tier), labels (1 = `large`), a threshold `t` (score >= t goes to
the large tier) and, for savings, the estimated cost of one call per row in each tier.
- recall of large  = |{large rows with score >= t}| / |large rows|   (the quality proxy)
- share to large   = |{rows with score >= t}| / |rows|                 (1.0 for always-large)
- savings          = 1 - sum(cost of the routed tier) / sum(cost of the large tier)
Threshold rules:
- for a target recall R: the highest t with recall >= R, lowered half-way to the next lower score (margin);
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
