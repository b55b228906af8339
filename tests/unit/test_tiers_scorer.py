"""The shipped scorer artifact: loading, score range, determinism, and clear errors for bad artifacts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.router.tiers.embedding import EMBEDDING_DIM
from fleetgate.router.tiers.features import STRUCTURAL_FEATURES, normalize_embedding
from fleetgate.router.tiers.scorer import DEFAULT_ARTIFACT, LinearModel, ScorerArtifact, TierScorer, sigmoid

PROMPTS = [
    "hi",
    "What is the capital of Japan?",
    "Prove that there are infinitely many primes.",
    "Design a multi-region, strongly consistent key-value store and explain the trade-offs.",
    "x" * 20_000,
    "",
]


def random_unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=EMBEDDING_DIM)
    unit = normalize_embedding(v)
    assert unit is not None
    return unit


def test_shipped_artifact_loads_with_both_models_and_calibration_data() -> None:
    artifact = ScorerArtifact.load()
    assert artifact.full.weights.shape == (len(STRUCTURAL_FEATURES) + EMBEDDING_DIM,)
    assert artifact.structural.weights.shape == (len(STRUCTURAL_FEATURES),)
    assert 0 < artifact.full.threshold < 1 and 0 < artifact.structural.threshold < 1
    assert len(artifact.full.oos_scores) == len(artifact.labels) == len(artifact.input_tokens) == artifact.meta["rows"]
    names = [s["name"] for s in artifact.meta["sources"]]
    assert names[0] == "train.jsonl"  # the project's own prompts, plus the dev set
    assert sum(s["rows"] for s in artifact.meta["sources"]) == artifact.meta["rows"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_scores_are_probabilities_and_deterministic(prompt: str) -> None:
    scorer = TierScorer(artifact=ScorerArtifact.load())
    for embedding in (None, random_unit(len(prompt))):
        first = scorer.score(prompt, embedding=embedding)
        again = scorer.score(prompt, embedding=embedding)
        assert 0.0 <= first.value <= 1.0
        assert first == again
        assert first.model == ("structural" if embedding is None else "full")


def test_full_model_uses_the_embedding() -> None:
    scorer = TierScorer(artifact=ScorerArtifact.load())
    w = scorer.artifact.full.weights[len(STRUCTURAL_FEATURES) :]
    toward_large = normalize_embedding(w)
    toward_small = normalize_embedding(-w)
    assert toward_large is not None and toward_small is not None
    text = "Tell me about it."
    assert scorer.score(text, embedding=toward_large).value > scorer.score(text, embedding=toward_small).value


def test_linear_model_rejects_wrong_feature_size() -> None:
    model = LinearModel(weights=np.ones(3), bias=0.0, threshold=0.5)
    assert model.score(np.zeros(3)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="shape"):
        model.score(np.zeros(4))


def test_sigmoid_is_stable_at_extremes() -> None:
    assert sigmoid(-1000.0) == 0.0 and sigmoid(1000.0) == 1.0
    assert sigmoid(0.0) == 0.5


def test_round_trip(tmp_path: Path) -> None:
    artifact = ScorerArtifact.load()
    path = tmp_path / "copy.json"
    artifact.save(path)
    again = ScorerArtifact.load(path)
    assert np.array_equal(again.full.weights, artifact.full.weights)
    assert again.full.threshold == artifact.full.threshold and again.meta == artifact.meta


def test_bad_artifacts_raise_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        ScorerArtifact.load(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ScorerArtifact.load(broken)
    data = json.loads(DEFAULT_ARTIFACT.read_text())
    for mutate, message in (
        (lambda d: d.update(version=99), "version"),
        (lambda d: d.update(features=["other"]), "other features"),
        (lambda d: d["structural"].update(weights=[1.0, 2.0]), "wrong size"),
        (lambda d: d.pop("full"), "malformed"),
    ):
        copy = json.loads(json.dumps(data))
        mutate(copy)
        path = tmp_path / "mutated.json"
        path.write_text(json.dumps(copy))
        with pytest.raises(ConfigError, match=message):
            ScorerArtifact.load(path)


def test_shipped_artifact_matches_the_training_prompts_and_the_current_feature_code() -> None:
    """If the feature code or the project's training prompts changed, the shipped artifact is stale: rerun
    `fleetgate tier train`. Checked on the prompts in the repository, so no data from outside the clone."""
    from fleetgate.router.tiers.data import DEFAULT_TRAIN, load_labelled
    from fleetgate.router.tiers.training import data_fingerprint, structural_fingerprint

    rows = load_labelled(DEFAULT_TRAIN)
    source = next(s for s in ScorerArtifact.load().meta["sources"] if s["name"] == DEFAULT_TRAIN.name)
    assert source["rows"] == len(rows)
    assert source["data_sha256"] == data_fingerprint(rows)
    assert source["structural_features_sha256"] == structural_fingerprint([r.text for r in rows])
