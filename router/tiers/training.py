"""Training the tier scorer: L2-regularised logistic regression, hyper-parameters and threshold chosen out of sample.

Inputs: labelled prompts (`data.LabelledPrompt`: text, large/small), their MiniLM embeddings, a seed, the number
of folds `k`, the target recall of `large` prompts (default 0.95) and a grid of inverse regularisation strengths
`C`. Steps, for each of the two models (`full` = structural + embedding, `structural` = structural only):
1. Structural features are standardised (training mean and standard deviation) and multiplied by
   `struct_weight` (0.1 in the full model, so 10 hand-made signals do not drown 384 embedding dimensions
   under one L2 penalty; 1.0 in the structural model); embeddings enter as they are (unit vectors).
2. For each C in the grid, stratified k-fold cross-validation (shuffled with `seed`) yields one out-of-sample
   score per row; the C whose out-of-sample scores send the fewest calls to the large tier at the target
   recall wins (ties: the smaller C, i.e. the simpler model).
3. The threshold is the highest one at which the out-of-sample recall of `large` prompts meets the target,
   lowered half-way to the next score below it as a margin.
4. The final model is fit on every row; the standardisation is folded into the weights (`w / sd * s`,
   `b - sum(w * mean / sd * s)`) so that serving is one dot product over raw features.
scikit-learn's `lbfgs` solver is deterministic, so the same data and seed give the same artifact.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleetgate.router.tiers.calibration import routing_metrics, threshold_for_recall
from fleetgate.router.tiers.data import LabelledPrompt, estimate_tokens
from fleetgate.router.tiers.features import STRUCTURAL_FEATURES, feature_matrix, structural_features
from fleetgate.router.tiers.scorer import LinearModel, ScorerArtifact

DEFAULT_C_GRID: tuple[float, ...] = (1.0, 3.0, 10.0, 30.0)
FULL_STRUCT_WEIGHT = 0.1
N_STRUCT = len(STRUCTURAL_FEATURES)


@dataclass(frozen=True, slots=True)
class FitParams:
    c: float
    struct_weight: float


def fit_raw(x: np.ndarray, y: np.ndarray, *, params: FitParams) -> tuple[np.ndarray, float]:
    """Fit on raw features (first `N_STRUCT` columns structural); weights and bias for raw features."""
    from sklearn.linear_model import LogisticRegression

    mean = np.zeros(x.shape[1])
    scale = np.ones(x.shape[1])
    mean[:N_STRUCT] = x[:, :N_STRUCT].mean(axis=0)
    sd = x[:, :N_STRUCT].std(axis=0)
    scale[:N_STRUCT] = np.where(sd > 1e-12, sd, 1.0) / params.struct_weight
    model = LogisticRegression(C=params.c, max_iter=10_000, solver="lbfgs")
    model.fit((x - mean) / scale, y)
    w = model.coef_[0] / scale
    b = float(model.intercept_[0] - np.dot(w, mean))
    return w, b


def _raw_scores(x: np.ndarray, w: np.ndarray, b: float) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-(x @ w + b))))


def cross_val_scores(x: np.ndarray, y: np.ndarray, *, params: FitParams, folds: int, seed: int) -> np.ndarray:
    """One out-of-sample score per row from stratified, shuffled k-fold cross-validation."""
    from sklearn.model_selection import StratifiedKFold

    scores = np.zeros(len(y))
    for train_idx, test_idx in StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed).split(x, y):
        w, b = fit_raw(x[train_idx], y[train_idx], params=params)
        scores[test_idx] = _raw_scores(x[test_idx], w, b)
    return scores


def _select(
    x: np.ndarray, y: np.ndarray, *, struct_weight: float, c_grid: Sequence[float], folds: int, seed: int,
    target_recall: float,
) -> tuple[FitParams, np.ndarray]:
    best: tuple[float, FitParams, np.ndarray] | None = None
    for c in sorted(c_grid):
        params = FitParams(c=c, struct_weight=struct_weight)
        oos = cross_val_scores(x, y, params=params, folds=folds, seed=seed)
        t = threshold_for_recall(oos, y, target=target_recall)
        share = routing_metrics(oos, y, threshold=t).share_large
        if best is None or share < best[0] - 1e-12:
            best = (share, params, oos)
    if best is None:
        raise ValueError("the C grid is empty")
    return best[1], best[2]


def _fit_model(
    x: np.ndarray, y: np.ndarray, *, struct_weight: float, c_grid: Sequence[float], folds: int, seed: int,
    target_recall: float,
) -> tuple[LinearModel, FitParams]:
    params, oos = _select(
        x, y, struct_weight=struct_weight, c_grid=c_grid, folds=folds, seed=seed, target_recall=target_recall
    )
    w, b = fit_raw(x, y, params=params)
    threshold = threshold_for_recall(oos, y, target=target_recall)
    model = LinearModel(
        weights=np.round(w, 10), bias=round(b, 10), threshold=round(threshold, 6),
        oos_scores=[round(float(s), 6) for s in oos],
    )
    return model, params


def structural_fingerprint(texts: Sequence[str]) -> str:
    """sha256 of the structural features of `texts` (rounded): pins the feature code an artifact was trained with."""
    x = np.round(np.vstack([structural_features(t) for t in texts]), 8)
    return hashlib.sha256(x.tobytes()).hexdigest()


def data_fingerprint(rows: Sequence[LabelledPrompt]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(f"{r.id}\t{int(r.large)}\t{r.text}\n".encode())
    return h.hexdigest()


def train(
    rows: Sequence[LabelledPrompt], embeddings: np.ndarray, *, seed: int = 0, folds: int = 5,
    target_recall: float = 0.95, c_grid: Sequence[float] = DEFAULT_C_GRID, source: str = "",
) -> ScorerArtifact:
    """Train both models on `rows` (with their embeddings, same order) into an artifact."""
    if len(rows) != len(embeddings):
        raise ValueError(f"{len(rows)} rows but {len(embeddings)} embeddings")
    y = np.asarray([int(r.large) for r in rows])
    if y.sum() < folds or (1 - y).sum() < folds:
        raise ValueError(f"need at least {folds} prompts of each tier to train with {folds} folds")
    x = feature_matrix([r.text for r in rows], np.asarray(embeddings, dtype=np.float64))
    full, full_params = _fit_model(
        x, y, struct_weight=FULL_STRUCT_WEIGHT, c_grid=c_grid, folds=folds, seed=seed, target_recall=target_recall
    )
    structural, struct_params = _fit_model(
        x[:, :N_STRUCT], y, struct_weight=1.0, c_grid=c_grid, folds=folds, seed=seed, target_recall=target_recall
    )
    meta = {
        "source": source,
        "rows": len(rows),
        "data_sha256": data_fingerprint(rows),
        "structural_features_sha256": structural_fingerprint([r.text for r in rows]),
        "seed": seed,
        "folds": folds,
        "target_recall": target_recall,
        "c_grid": list(c_grid),
        "full": {"C": full_params.c, "struct_weight": full_params.struct_weight},
        "structural": {"C": struct_params.c, "struct_weight": struct_params.struct_weight},
        "embedding_model": "all-MiniLM-L6-v2",
    }
    return ScorerArtifact(
        full=full, structural=structural, labels=[int(v) for v in y],
        input_tokens=[estimate_tokens(r.text) for r in rows], categories=[r.category for r in rows], meta=meta,
    )
