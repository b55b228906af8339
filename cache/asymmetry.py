"""Asymmetric content: what one prompt asks for that the other does not (issue 30).

A request that adds a constraint, an exclusion, a scope, a format, an audience or a step ("a story about a
lighthouse" / "... told entirely through letters", "explain quicksort" / "explain quicksort. Avoid jargon.")
keeps every word of the other prompt, so the word match and the symmetric token alignment see a close pair;
a politeness wrapper or a redundant word ("Hi, quick question: ...", "the capital city of Canada") looks the
same to them. What tells the two apart is *what* the left-over words say, which MiniLM's contextual token
states carry: a linear head (`ResidualHead`, fitted with the pair model by `fleetgate.cache.training`) reads
two vectors made of the states of the two prompts (`residual_inputs`):
- `r`: the rarity-weighted mean state of the content words whose best match on the other side has cosine
  below `RESIDUAL_TAU` (the words no counterpart explains, on either side): "dialogue", "jargon",
  "wheelchair" against "hope", "quick", "thanks";
- `d`: the mean word state of the prompt with more such unexplained content minus the other prompt's (what
  the longer request adds, as a direction); 0 when both hold the same amount, so the input is the same for
  (a, b) and (b, a) and the verdict stays symmetric.
Its output (`ResidualHead.score`: the head's log-odds for [r, d], clipped to `SCORE_RANGE`) is one more input of
the pair model, `align_residual`. No word list: the head is fitted on labelled pairs (the hand-written
constraint pairs of `cache/data/` among them).

Interface: a function of the two prompts' token states grouped into words (`tokenalign.Words`), the same
input the token alignment needs, so an embedder that hands over token states (the int8 ONNX one, or a remote
encoder that returns them) gives everything this needs; no second model and no second encoder pass.
Cost: a second (words x words) cosine matrix like the alignment's, and a dot product of
2 x 384 numbers, only for the pairs that reach the pair model and need token states.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetgate.cache.tokenalign import ALIGN_FEATURES, NEUTRAL, Words, align_features, content_weight
from fleetgate.cache.wordmatch import zipf

RESIDUAL_TAU = 0.75  # best-match cosine below this: a word the other prompt does not explain
# The head's output range. Its out-of-fold scores on the development rows lie in [-1.4, 1.5] (1st to 99th
# percentile), so clipping there costs nothing measurable in grouped cross-validation (pairs recall 59.3% vs
# 60.4% unclipped at the same precision), keeps an odd input (a prompt of made-up words) from dominating the
# model, and keeps the ceiling low: `verifier.judge_without_alignment` must assume the best score a pair's
# token states could give, and a ceiling of 4 left 1 of 381 near misses of `bench gateway`'s varied workload
# settled without token states (main: all of them).
SCORE_RANGE = (-1.5, 1.0)
RESIDUAL_FEATURES = ("align_residual",)
# every feature computed from token states, in the pair model's order, and their values when no states are
# available (tests with the hashing embedder): perfect alignment, nothing left unexplained
STATE_FEATURES: tuple[str, ...] = (*ALIGN_FEATURES, *RESIDUAL_FEATURES)
STATE_NEUTRAL: tuple[float, ...] = (*NEUTRAL, 0.0)

# Round 7 of issue 30 measured asymmetric alignment features: per side, the rarity-weighted share of its content
# words that the other side leaves unexplained (`side_shares`: the larger share, the smaller and their
# difference, so the input stays symmetric), the same as unexplained weight (`side_mass`), and the residual head
# fed each side's unexplained words separately (`side_residual_inputs`). None is an input of the shipped model:
# refitted with them, the model made the same number of false hits within one on every left-out source and in
# grouped cross-validation (docs/reports/cache-precision-round7.md; `scripts/asymmetry/experiment.py` repeats
# it). They stay here, tested, so that a later refit can name them in `pairfeatures.FEATURES`.
SIDE_TAU = 0.75  # a content word whose best match on the other side is below this is unexplained
SIDE_FEATURES = ("asym_share_max", "asym_share_min", "asym_share_gap")


def _best(a: Words, b: Words) -> tuple[np.ndarray, np.ndarray]:
    """Each word's best-match cosine on the other side: (over a's words, over b's words)."""
    sims = a.vectors @ b.vectors.T
    return sims.max(axis=1), sims.max(axis=0)


def _unexplained(words: Words, best: np.ndarray, tau: float | None, cut: float | None) -> tuple[float, float]:
    """(unexplained content weight, content weight) of one side; `tau` None: soft, weight x (1 - best); `cut`:
    weights max(0, cut - Zipf frequency) instead of `content_weight`'s (a higher cut counts commoner words)."""
    weights = np.array([content_weight(w) if cut is None else max(0.0, cut - zipf(w)) for w in words.text])
    total = float(weights.sum())
    left = weights * (best < tau) if tau is not None else weights * np.clip(1.0 - best, 0.0, 1.0)
    return float(left.sum()), total


def side_shares(a: Words, b: Words, *, tau: float | None = SIDE_TAU,
                cut: float | None = None) -> tuple[float, float, float]:
    """Per side, the rarity-weighted share of its content words left unexplained by the other side (best match
    below `tau`): (the larger share, the smaller, their difference). Symmetric in a and b; a side without
    content words counts 0, and (0, 0, 0) when a side has no word."""
    if not len(a.text) or not len(b.text):
        return (0.0, 0.0, 0.0)
    best_a, best_b = _best(a, b)
    shares = []
    for words, best in ((a, best_a), (b, best_b)):
        left, total = _unexplained(words, best, tau, cut)
        shares.append(left / total if total > 0 else 0.0)
    high, low = max(shares), min(shares)
    return (high, low, high - low)


def side_mass(a: Words, b: Words, *, tau: float | None = SIDE_TAU,
              cut: float | None = None) -> tuple[float, float, float]:
    """`side_shares` with the unexplained content weight itself (not divided by the side's content)."""
    if not len(a.text) or not len(b.text):
        return (0.0, 0.0, 0.0)
    best_a, best_b = _best(a, b)
    mass = [_unexplained(a, best_a, tau, cut)[0], _unexplained(b, best_b, tau, cut)[0]]
    return (max(mass), min(mass), max(mass) - min(mass))


def residual_inputs(a: Words, b: Words) -> np.ndarray:
    """[r, d] of two prompts (see the module docstring): 2 x the token-state width, zeros when a prompt has no
    word. Symmetric: `residual_inputs(b, a)` is the same vector."""
    dim = a.vectors.shape[1] if a.vectors.ndim == 2 else b.vectors.shape[1]
    if not len(a.text) or not len(b.text):
        return np.zeros(2 * dim)
    sims = a.vectors @ b.vectors.T
    sums, masses = [], []
    for words, best in ((a, sims.max(axis=1)), (b, sims.max(axis=0))):
        weights = np.array([content_weight(w) for w in words.text]) * (best < RESIDUAL_TAU)
        masses.append(float(weights.sum()))
        sums.append(weights @ words.vectors)
    total = masses[0] + masses[1]
    r = (sums[0] + sums[1]) / total if total > 0 else np.zeros(dim)
    gap = masses[0] - masses[1]
    sign = 0.0 if abs(gap) < 1e-9 else (1.0 if gap > 0 else -1.0)
    d = sign * (a.vectors.mean(axis=0) - b.vectors.mean(axis=0))
    return np.concatenate([r, d])


def side_residual_inputs(a: Words, b: Words, *, tau: float = RESIDUAL_TAU) -> np.ndarray:
    """[r_more, r_less, d]: `residual_inputs` with the unexplained words' mean state kept per side, the side with
    more unexplained content weight first (so what one side adds and what the other adds are two inputs, not one
    pooled mean). Symmetric in a and b (ties: the pooled mean on both)."""
    dim = a.vectors.shape[1] if a.vectors.ndim == 2 else b.vectors.shape[1]
    if not len(a.text) or not len(b.text):
        return np.zeros(3 * dim)
    best_a, best_b = _best(a, b)
    means, masses = [], []
    for words, best in ((a, best_a), (b, best_b)):
        weights = np.array([content_weight(w) for w in words.text]) * (best < tau)
        mass = float(weights.sum())
        masses.append(mass)
        means.append(weights @ words.vectors / mass if mass > 0 else np.zeros(dim))
    gap = masses[0] - masses[1]
    if abs(gap) < 1e-9:
        pooled = (means[0] + means[1]) / 2
        return np.concatenate([pooled, pooled, np.zeros(dim)])
    more, less = (0, 1) if gap > 0 else (1, 0)
    sign = 1.0 if gap > 0 else -1.0
    return np.concatenate([means[more], means[less], sign * (a.vectors.mean(axis=0) - b.vectors.mean(axis=0))])


@dataclass(frozen=True, slots=True)
class ResidualHead:
    """A logistic regression over `residual_inputs` (same answer: 1), fitted by `fleetgate.cache.training`."""

    coef: tuple[float, ...]
    intercept: float

    def score(self, x: np.ndarray) -> float:
        """The log-odds for `residual_inputs` `x` (higher: the left-over words look like rewording and
        courtesy; lower: like a request of their own), clipped to `SCORE_RANGE`."""
        return float(np.clip(self.intercept + np.dot(np.asarray(self.coef, dtype=np.float64), x), *SCORE_RANGE))

    def to_dict(self) -> dict[str, Any]:
        return {"coef": [round(c, 8) for c in self.coef], "intercept": round(self.intercept, 8),
                "tau": RESIDUAL_TAU, "range": list(SCORE_RANGE)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ResidualHead:
        if float(raw.get("tau", RESIDUAL_TAU)) != RESIDUAL_TAU or tuple(raw.get("range", SCORE_RANGE)) != SCORE_RANGE:
            raise ValueError("residual head fitted with another RESIDUAL_TAU or SCORE_RANGE than the code's: refit it "
                             "with `fleetgate cache-eval --fit`")
        return cls(coef=tuple(map(float, raw["coef"])), intercept=float(raw["intercept"]))


def state_features(a: Words, b: Words, swaps: Sequence[tuple[str, str]] = (), *,
                   head: ResidualHead | None = None) -> tuple[float, ...]:
    """`STATE_FEATURES` of two prompts: the token alignment (`tokenalign.align_features`) and the residual
    head's score (0 without a head: a model fitted without token states)."""
    residual = head.score(residual_inputs(a, b)) if head is not None else 0.0
    return (*align_features(a, b, swaps), residual)
