"""The pair model's file format and arithmetic, and the shipped model's sanity."""

from __future__ import annotations

import json
import math

import pytest

from fleetgate.cache.asymmetry import ResidualHead
from fleetgate.cache.pairfeatures import FEATURES
from fleetgate.cache.pairmodel import MODEL_PATH, PairModel, load_model


def _model(**change: object) -> PairModel:
    n = len(FEATURES)
    fields: dict[str, object] = {"features": FEATURES, "mean": (0.0,) * n, "scale": (1.0,) * n,
                                 "coef": (2.0,) + (0.0,) * (n - 1), "intercept": -1.0, "threshold": 0.9, "info": {}}
    fields.update(change)
    return PairModel(**fields)  # type: ignore[arg-type]


def test_probability_is_the_logistic_of_the_standardised_dot_product() -> None:
    model = _model(mean=(0.5,) + (0.0,) * (len(FEATURES) - 1), scale=(0.25,) + (1.0,) * (len(FEATURES) - 1))
    x = [1.0] + [7.0] * (len(FEATURES) - 1)  # other features have zero weight
    assert model.probability(x) == pytest.approx(1 / (1 + math.exp(-(-1.0 + 2.0 * (1.0 - 0.5) / 0.25))))


def test_json_round_trip() -> None:
    model = _model(info={"rows": 3})
    assert PairModel.from_json(model.to_json()) == model
    with_head = _model(head=ResidualHead(coef=(0.5, -0.25, 1.0), intercept=0.125))
    assert PairModel.from_json(with_head.to_json()) == with_head


def test_a_model_fitted_on_other_features_is_refused() -> None:
    raw = json.loads(_model().to_json())
    raw["features"] = [*raw["features"][:-1], "something_else"]
    with pytest.raises(ValueError, match="refit"):
        PairModel.from_json(json.dumps(raw))
    raw = json.loads(_model().to_json())
    raw["coef"] = raw["coef"][:-1]
    with pytest.raises(ValueError, match="one value per feature"):
        PairModel.from_json(json.dumps(raw))


def test_the_shipped_model_loads_and_was_cross_validated() -> None:
    model = load_model(MODEL_PATH)
    assert model.features == FEATURES
    assert 0.5 <= model.threshold < 1.0
    assert model.info["cv_precision"] >= 0.98
    # a perfect paraphrase signal scores higher than the same pair at a low similarity
    sim = FEATURES.index("similarity")
    x = list(model.mean)
    low, high = list(x), list(x)
    low[sim], high[sim] = 0.5, 0.95
    assert model.probability(high) > model.probability(low)


def test_the_shipped_model_weighs_its_residual_head() -> None:
    """Issue 30: the head is part of the artefact and its score counts (left-over words that read like a
    request of their own lower the probability)."""
    model = load_model(MODEL_PATH)
    assert model.head is not None and len(model.head.coef) == 2 * 384
    assert model.uses_alignment
    assert model.coef[FEATURES.index("align_residual")] > 0
