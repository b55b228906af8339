"""Training the tier scorer: L2-regularised logistic regression, hyper-parameters and threshold chosen out of sample.

Inputs: labelled prompts (`data.LabelledPrompt`: text, large/small; by default the project's hand-written
prompts plus the dev set), their MiniLM embeddings, a seed, the number of folds `k`, the target recall of
`large` prompts (default 0.95) with the confidence of the bound that sets the threshold (default 0.95), and
grids of inverse regularisation strengths `C` and structural-feature weights. Steps, for each of the two models
(`full` = structural + embedding, `structural` = structural only):
1. Structural features are standardised (training mean and standard deviation) and multiplied by
   `struct_weight` (searched in the full model, where 10 hand-made signals share one L2 penalty with 384
   embedding dimensions; 1.0 in the structural model); embeddings enter as they are (unit vectors).
2. For each (C, struct_weight), stratified k-fold cross-validation (shuffled with `seed`) yields one
   out-of-sample score per row; the pair whose out-of-sample scores send the fewest calls to the large tier at
   the calibrated threshold wins (ties: the smaller C, i.e. the simpler model).
3. The threshold is `calibration.threshold_for_recall_bound` on those out-of-sample scores: the highest one
   at which the recall of new `large` prompts is >= the target with the given confidence (a Clopper-Pearson
   margin: with ~350 `large` rows, 95% recall at the default 99% confidence asks ~97.7% out of sample; the
   high confidence also buys room for prompts written by other people than the training data's authors).
4. The final model is fit on every row; the standardisation is folded into the weights (`w / sd * s`,
   `b - sum(w * mean / sd * s)`) so that serving is one dot product over raw features.
scikit-learn's `lbfgs` solver is deterministic, so the same data and seed give the same artifact.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleetgate.router.tiers.calibration import routing_metrics, threshold_for_recall_bound
from fleetgate.router.tiers.data import LabelledPrompt, estimate_tokens
from fleetgate.router.tiers.features import STRUCTURAL_FEATURES, feature_matrix, structural_features
from fleetgate.router.tiers.scorer import LinearModel, ScorerArtifact

DEFAULT_C_GRID: tuple[float, ...] = (1.0, 3.0, 10.0, 30.0)
FULL_STRUCT_WEIGHTS: tuple[float, ...] = (0.1, 0.3)
DEFAULT_TARGET_RECALL = 0.95
DEFAULT_CONFIDENCE = 0.99
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


@dataclass(frozen=True, slots=True)
class Calibration:
    target_recall: float = DEFAULT_TARGET_RECALL
    confidence: float = DEFAULT_CONFIDENCE

    def threshold(self, scores: np.ndarray, labels: np.ndarray) -> float:
        return threshold_for_recall_bound(scores, labels, target=self.target_recall, confidence=self.confidence)


def select_params(
    x: np.ndarray, y: np.ndarray, *, struct_weights: Sequence[float], c_grid: Sequence[float], folds: int,
    seed: int, calibration: Calibration,
) -> tuple[FitParams, np.ndarray]:
    """The (C, struct_weight) with the fewest large-tier calls at the calibrated threshold, and its scores."""
    best: tuple[float, FitParams, np.ndarray] | None = None
    for struct_weight in struct_weights:
        for c in sorted(c_grid):
            params = FitParams(c=c, struct_weight=struct_weight)
            oos = cross_val_scores(x, y, params=params, folds=folds, seed=seed)
            share = routing_metrics(oos, y, threshold=calibration.threshold(oos, y)).share_large
            if best is None or share < best[0] - 1e-12:
                best = (share, params, oos)
    if best is None:
        raise ValueError("the C grid is empty")
    return best[1], best[2]


def _fit_model(
    x: np.ndarray, y: np.ndarray, *, struct_weights: Sequence[float], c_grid: Sequence[float], folds: int,
    seed: int, calibration: Calibration,
) -> tuple[LinearModel, FitParams]:
    params, oos = select_params(
        x, y, struct_weights=struct_weights, c_grid=c_grid, folds=folds, seed=seed, calibration=calibration
    )
    w, b = fit_raw(x, y, params=params)
    threshold = calibration.threshold(oos, y)
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
    target_recall: float = DEFAULT_TARGET_RECALL, confidence: float = DEFAULT_CONFIDENCE,
    c_grid: Sequence[float] = DEFAULT_C_GRID, struct_weights: Sequence[float] = FULL_STRUCT_WEIGHTS,
    sources: Sequence[tuple[str, Sequence[LabelledPrompt]]] = (),
) -> ScorerArtifact:
    """Train both models on `rows` (with their embeddings, same order) into an artifact.

    `sources` names the files the rows came from (name, rows), recorded with their fingerprints in the meta."""
    if len(rows) != len(embeddings):
        raise ValueError(f"{len(rows)} rows but {len(embeddings)} embeddings")
    y = np.asarray([int(r.large) for r in rows])
    if y.sum() < folds or (1 - y).sum() < folds:
        raise ValueError(f"need at least {folds} prompts of each tier to train with {folds} folds")
    x = feature_matrix([r.text for r in rows], np.asarray(embeddings, dtype=np.float64))
    calibration = Calibration(target_recall=target_recall, confidence=confidence)
    full, full_params = _fit_model(
        x, y, struct_weights=struct_weights, c_grid=c_grid, folds=folds, seed=seed, calibration=calibration
    )
    structural, struct_params = _fit_model(
        x[:, :N_STRUCT], y, struct_weights=(1.0,), c_grid=c_grid, folds=folds, seed=seed, calibration=calibration
    )
    meta = {
        "sources": [
            {"name": name, "rows": len(part), "data_sha256": data_fingerprint(part),
             "structural_features_sha256": structural_fingerprint([r.text for r in part])}
            for name, part in sources
        ],
        "rows": len(rows),
        "data_sha256": data_fingerprint(rows),
        "structural_features_sha256": structural_fingerprint([r.text for r in rows]),
        "seed": seed,
        "folds": folds,
        "target_recall": target_recall,
        "confidence": confidence,
        "c_grid": list(c_grid),
        "struct_weights": list(struct_weights),
        "full": {"C": full_params.c, "struct_weight": full_params.struct_weight},
        "structural": {"C": struct_params.c, "struct_weight": struct_params.struct_weight},
        "embedding_model": "all-MiniLM-L6-v2",
    }
    return ScorerArtifact(
        full=full, structural=structural, labels=[int(v) for v in y],
        input_tokens=[estimate_tokens(r.text) for r in rows], categories=[r.category for r in rows], meta=meta,
    )
