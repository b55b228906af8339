"""Min-max normalisation shared by the load scorers: the least loaded scores 1, the most 0.

score_e = (max - x_e) / (max - min), or 1 for every endpoint when all are equal.
"""

from __future__ import annotations

from collections.abc import Sequence


def inverse_minmax(values: Sequence[float]) -> list[float]:
    if not values:
        return []
    lo, hi = min(values), max(values)
    if hi - lo <= 1e-12:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]
