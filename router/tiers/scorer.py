"""The tier scorer: P(prompt needs the strong tier) = sigmoid(w . x + b), a logistic regression.

Inputs: `x` = `features.feature_vector(text, embedding)` (structural signals, then the 384-d MiniLM embedding)
for the `full` model, or the structural signals alone for the `structural` model (used when no embedding is
available and computing one is not allowed, or it failed). Weights are stored for raw features (the training
standardisation is folded in), so scoring is one dot product: a few microseconds.

The artifact (JSON, default `router/tiers/scorer.json`) holds both models, each with the threshold calibrated
on out-of-sample (cross-validated) scores, the training metadata (data hash, seed, folds, hyper-parameters)
and the out-of-sample scores and labels that `fleetgate tier calibrate` uses.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fleetgate.core.errors import ConfigError
from fleetgate.router.tiers.features import STRUCTURAL_FEATURES, feature_vector, structural_features

DEFAULT_ARTIFACT = Path(__file__).with_name("scorer.json")
ARTIFACT_VERSION = 1


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@dataclass(frozen=True, slots=True)
class LinearModel:
    """Logistic regression on raw features, plus its calibrated threshold and out-of-sample scores."""

    weights: np.ndarray
    bias: float
    threshold: float
    oos_scores: list[float] = field(default_factory=list)  # cross-validated scores, one per training row

    def score(self, x: np.ndarray) -> float:
        if x.shape != self.weights.shape:
            raise ValueError(f"feature vector has shape {x.shape}, the model expects {self.weights.shape}")
        return sigmoid(float(np.dot(self.weights, x)) + self.bias)

    def to_json(self) -> dict[str, Any]:
        return {
            "weights": [float(w) for w in self.weights],
            "bias": float(self.bias),
            "threshold": float(self.threshold),
            "oos_scores": [float(s) for s in self.oos_scores],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinearModel:
        return cls(
            weights=np.asarray(data["weights"], dtype=np.float64),
            bias=float(data["bias"]),
            threshold=float(data["threshold"]),
            oos_scores=[float(s) for s in data.get("oos_scores", [])],
        )


@dataclass(frozen=True, slots=True)
class ScorerArtifact:
    full: LinearModel  # structural features + embedding
    structural: LinearModel  # structural features only
    labels: list[int] = field(default_factory=list)  # 1 = large, per training row (for calibration)
    input_tokens: list[int] = field(default_factory=list)  # estimated prompt tokens per training row
    categories: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": ARTIFACT_VERSION,
            "features": [*STRUCTURAL_FEATURES, "embedding[384]"],
            "meta": self.meta,
            "full": self.full.to_json(),
            "structural": self.structural.to_json(),
            "labels": self.labels,
            "input_tokens": self.input_tokens,
            "categories": self.categories,
        }

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path | None = None) -> ScorerArtifact:
        p = path or DEFAULT_ARTIFACT
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"tier scorer artifact {p} does not exist (run `fleetgate tier train`)") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"tier scorer artifact {p} is not valid JSON: {exc}") from exc
        if data.get("version") != ARTIFACT_VERSION:
            raise ConfigError(f"tier scorer artifact {p} has version {data.get('version')}, expected 1")
        if data.get("features", [])[: len(STRUCTURAL_FEATURES)] != list(STRUCTURAL_FEATURES):
            raise ConfigError(f"tier scorer artifact {p} was trained on other features; retrain it")
        try:
            artifact = cls(
                full=LinearModel.from_json(data["full"]),
                structural=LinearModel.from_json(data["structural"]),
                labels=[int(v) for v in data.get("labels", [])],
                input_tokens=[int(v) for v in data.get("input_tokens", [])],
                categories=[str(v) for v in data.get("categories", [])],
                meta=dict(data.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"tier scorer artifact {p} is malformed: {exc}") from exc
        n = len(STRUCTURAL_FEATURES)
        if artifact.structural.weights.shape != (n,) or artifact.full.weights.shape[0] <= n:
            raise ConfigError(f"tier scorer artifact {p} has weights of the wrong size")
        return artifact


@dataclass(frozen=True, slots=True)
class Score:
    value: float  # need for the strong tier, in [0, 1]
    model: str  # "full" or "structural"
    threshold: float  # that model's calibrated threshold


class TierScorer:
    """Scores prompts with an artifact; pure and synchronous (the embedding is computed by the caller)."""

    def __init__(self, *, artifact: ScorerArtifact) -> None:
        self.artifact = artifact

    def score(self, text: str, *, embedding: np.ndarray | None) -> Score:
        """`embedding` must be a normalised 384-d vector (`features.normalize_embedding`) or None."""
        if embedding is None:
            model = self.artifact.structural
            return Score(model.score(structural_features(text)), "structural", model.threshold)
        model = self.artifact.full
        return Score(model.score(feature_vector(text, embedding)), "full", model.threshold)
