"""Min-max normalisation shared by the load scorers: the least loaded scores 1, the most 0 (more with `relative`).

score_e = 1 - (x_e - min) / span, span = max(max - min, relative x max), or 1 for every endpoint when all are equal.
With `relative` 0 (the default) span = max - min: any difference is a full vote. With `relative` r > 0 a difference
small against the load itself is a small vote: 61 against 60 requests in flight with r = 0.5 scores 1 and 0.97, not
1 and 0, while 1 against 0 or 20 against 10 stays a full vote. Why: past saturation the load scorers' full votes
over a request or two outweigh prefix affinity and move prompt groups between engines (issue 24).
"""

from __future__ import annotations

from collections.abc import Sequence


def inverse_minmax(values: Sequence[float], relative: float = 0.0) -> list[float]:
    if not values:
        return []
    lo, hi = min(values), max(values)
    span = max(hi - lo, relative * hi)
    if span <= 1e-12 or hi - lo <= 1e-12:
        return [1.0] * len(values)
    return [1.0 - (v - lo) / span for v in values]
