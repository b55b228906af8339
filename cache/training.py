"""Fitting the pair model and measuring it by cross-validation.

Examples: every pairs row, and every conversations row whose history (system prompt and earlier turns) is
identical on both sides; the others differ in their partition and can never hit, whatever the verifier
says. Each example goes through the lookup's own gates with the pair's cosine similarity:
- below the semantic similarity `threshold`: a miss;
- a structural veto (`fleetgate.cache.pairfeatures.veto`): a miss;
- nothing left after the word match: a hit without the model;
- otherwise a *candidate*: the model decides. Only candidates train the model.

Fitting: scikit-learn's `LogisticRegression` (L2, C = `C`) on standardised features; the weights are
exported into a `PairModel` (plain Python at run time). The operating threshold is the lowest point of
`THRESHOLD_GRID` at which the *lower* one-sided 95% Wilson bound of the out-of-fold precision over all
examples is >= `TARGET_PRECISION` (0.98, the product target): the margin over the point estimate grows
as the number of hits shrinks, so a point estimate of 100% on a handful of hits does not pass. Out-of-fold probabilities
come from `repeats` x `folds` stratified cross-validation over the candidates.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetgate.cache.evaluation import Score
from fleetgate.cache.keys import follows_user_turns
from fleetgate.cache.pairfeatures import FEATURES, features, veto
from fleetgate.cache.pairmodel import PairModel
from fleetgate.cache.textnorm import analyse
from fleetgate.cache.wordmatch import match

C = 1.0
TARGET_PRECISION = 0.98  # the product target, met by the lower confidence bound below (that is the margin)
Z = 1.645  # one-sided 95% Wilson bound
THRESHOLD_GRID = tuple(round(0.5 + 0.01 * i, 2) for i in range(50))  # 0.50 .. 0.99


@dataclass(frozen=True, slots=True)
class Example:
    a: str
    b: str
    same: bool
    kind: str
    source: str  # e.g. "dev pairs", "train conversations"
    shares_partition: bool
    conversation: bool = False  # the last messages follow earlier user turns


@dataclass(frozen=True, slots=True)
class Featurized:
    examples: tuple[Example, ...]
    x: np.ndarray  # (n, len(FEATURES)); rows of non-candidates are zeros
    y: np.ndarray  # bool
    candidate: np.ndarray  # bool: the model decides
    accepted: np.ndarray  # bool: a hit without the model


def examples(rows: Iterable[Mapping[str, Any]], *, source: str) -> list[Example]:
    out: list[Example] = []
    for row in rows:
        if "conv_a" in row:
            a, b = row["conv_a"], row["conv_b"]
            out.append(Example(a=str(a[-1]["content"]), b=str(b[-1]["content"]), same=bool(row["same"]),
                               kind=str(row["kind"]), source=source, shares_partition=a[:-1] == b[:-1],
                               conversation=follows_user_turns(a)))
        else:
            out.append(Example(a=str(row["a"]), b=str(row["b"]), same=bool(row["same"]), kind=str(row["kind"]),
                               source=source, shares_partition=True))
    return out


def featurize(items: Sequence[Example], vectors: Mapping[str, np.ndarray], *, threshold: float) -> Featurized:
    x = np.zeros((len(items), len(FEATURES)))
    candidate = np.zeros(len(items), dtype=bool)
    accepted = np.zeros(len(items), dtype=bool)
    for n, ex in enumerate(items):
        similarity = float(np.dot(vectors[ex.a], vectors[ex.b]))
        if not ex.shares_partition or similarity < threshold:
            continue
        if ex.a == ex.b:
            accepted[n] = True  # the exact layer
            continue
        a, b = analyse(ex.a), analyse(ex.b)
        m = match(a, b)
        if veto(a, b, match=m):
            continue
        if not m.left and not m.right:
            accepted[n] = True
            continue
        candidate[n] = True
        x[n] = features(a, b, similarity=similarity, match=m, text_a=ex.a, text_b=ex.b, conversation=ex.conversation)
    y = np.array([ex.same for ex in items], dtype=bool)
    return Featurized(examples=tuple(items), x=x, y=y, candidate=candidate, accepted=accepted)


def fit_model(x: np.ndarray, y: np.ndarray, *, threshold: float, c: float = C,
              info: dict[str, Any] | None = None) -> PairModel:
    from sklearn.linear_model import LogisticRegression

    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    lr = LogisticRegression(C=c, max_iter=5000).fit((x - mean) / scale, y)
    return PairModel(features=FEATURES, mean=tuple(mean.tolist()), scale=tuple(scale.tolist()),
                     coef=tuple(lr.coef_[0].tolist()), intercept=float(lr.intercept_[0]), threshold=threshold,
                     info=info or {})


def out_of_fold(data: Featurized, *, folds: int = 5, repeats: int = 5, seed: int = 0) -> np.ndarray:
    """Mean out-of-fold probability of every candidate (0 elsewhere)."""
    from sklearn.model_selection import StratifiedKFold

    idx = np.flatnonzero(data.candidate)
    total = np.zeros(len(data.y))
    for rep in range(repeats):
        splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed + rep)
        for train, test in splitter.split(idx, data.y[idx]):
            model = fit_model(data.x[idx[train]], data.y[idx[train]], threshold=0.5)
            for i in idx[test]:
                total[i] += model.probability(data.x[i].tolist())
    return total / repeats


def hits(data: Featurized, probs: np.ndarray, threshold: float) -> np.ndarray:
    return data.accepted | (data.candidate & (probs >= threshold))


def score(data: Featurized, hit: np.ndarray, mask: np.ndarray | None = None) -> Score:
    mask = np.ones(len(data.y), dtype=bool) if mask is None else mask
    s = Score(rows=int(mask.sum()), positives=int((data.y & mask).sum()), hits=int((hit & mask).sum()),
              true_hits=int((hit & data.y & mask).sum()))
    s.false_by_kind = Counter(ex.kind for ex, h, m, same in zip(data.examples, hit, mask, data.y, strict=True)
                              if h and m and not same)
    s.rows_by_kind = Counter(ex.kind for ex, m in zip(data.examples, mask, strict=True) if m)
    return s


def precision_lower_bound(s: Score, *, z: float = Z) -> float:
    """Wilson score lower bound of the precision (0.0 with no hit: nothing is proven)."""
    n = s.hits
    if n == 0:
        return 0.0
    p = s.true_hits / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n)


def choose_threshold(data: Featurized, probs: np.ndarray, *, target_precision: float = TARGET_PRECISION) -> float:
    """The lowest grid point whose out-of-fold precision's lower bound is >= the target (the highest point
    when none is: with few hits even a perfect record proves little)."""
    for t in THRESHOLD_GRID:
        if precision_lower_bound(score(data, hits(data, probs, t))) >= target_precision:
            return t
    return THRESHOLD_GRID[-1]


def fit(data: Featurized, *, target_precision: float = TARGET_PRECISION, folds: int = 5, repeats: int = 5) -> tuple[
        PairModel, np.ndarray]:
    """The model fitted on every candidate, with its threshold chosen on out-of-fold probabilities."""
    probs = out_of_fold(data, folds=folds, repeats=repeats)
    threshold = choose_threshold(data, probs, target_precision=target_precision)
    oof = score(data, hits(data, probs, threshold))
    sources = Counter(ex.source for ex in data.examples)
    info = {"rows": dict(sources), "candidates": int(data.candidate.sum()), "C": C,
            "target_precision": target_precision, "cv": f"{repeats}x{folds}-fold stratified",
            "cv_precision": round(oof.precision, 4), "cv_recall": round(oof.recall, 4)}
    idx = np.flatnonzero(data.candidate)
    return fit_model(data.x[idx], data.y[idx], threshold=threshold, info=info), probs
