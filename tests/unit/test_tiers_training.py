"""Training: seeded reproducibility, out-of-sample threshold, and what the data gives the scorer."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fleetgate.router.tiers.calibration import routing_metrics
from fleetgate.router.tiers.data import DEFAULT_TRAIN, LabelledPrompt, load_labelled
from fleetgate.router.tiers.embedding import EMBEDDING_DIM
from fleetgate.router.tiers.training import train


def synthetic_embeddings(rows: list[LabelledPrompt], *, signal: float) -> np.ndarray:
    """Per-prompt pseudo-random vectors (seeded by the text) with a label-dependent shift of size `signal`."""
    direction = np.random.default_rng(123).normal(size=EMBEDDING_DIM)
    out = []
    for r in rows:
        seed = int.from_bytes(hashlib.sha256(r.text.encode()).digest()[:8], "little")
        v = np.random.default_rng(seed).normal(size=EMBEDDING_DIM) + (signal if r.large else -signal) * direction
        out.append(v / np.linalg.norm(v))
    return np.asarray(out)


@pytest.fixture(scope="module")
def rows() -> list[LabelledPrompt]:
    every = load_labelled(DEFAULT_TRAIN)  # the project's own training prompts: no data from outside the clone
    return every[::3]  # 155 rows keep the test fast


def test_same_seed_gives_the_same_weights(rows: list[LabelledPrompt]) -> None:
    emb = synthetic_embeddings(rows, signal=0.2)
    a = train(rows, emb, seed=7, folds=3, c_grid=(1.0, 10.0))
    b = train(rows, emb, seed=7, folds=3, c_grid=(1.0, 10.0))
    assert a.to_json() == b.to_json()
    c = train(rows, emb, seed=8, folds=3, c_grid=(1.0, 10.0))
    assert c.full.oos_scores != a.full.oos_scores  # the seed drives the folds


def test_threshold_meets_the_target_recall_out_of_sample(rows: list[LabelledPrompt]) -> None:
    artifact = train(rows, synthetic_embeddings(rows, signal=0.1), seed=0, folds=3, c_grid=(1.0,))
    y = np.asarray(artifact.labels)
    for model in (artifact.full, artifact.structural):
        m = routing_metrics(np.asarray(model.oos_scores), y, threshold=model.threshold)
        assert m.recall_large >= 0.95
        assert m.share_large < 1.0


def test_embedding_signal_lowers_the_large_share(rows: list[LabelledPrompt]) -> None:
    """A stronger label signal in the embedding must let the full model send fewer calls to the large tier."""
    y = None
    shares = []
    for signal in (0.0, 0.3):
        artifact = train(rows, synthetic_embeddings(rows, signal=signal), seed=0, folds=3, c_grid=(1.0,))
        y = np.asarray(artifact.labels)
        shares.append(routing_metrics(np.asarray(artifact.full.oos_scores), y, threshold=artifact.full.threshold))
    assert shares[1].share_large < shares[0].share_large


def test_training_validates_its_inputs(rows: list[LabelledPrompt]) -> None:
    with pytest.raises(ValueError, match="embeddings"):
        train(rows, np.zeros((3, EMBEDDING_DIM)))
    only_small = [r for r in rows if not r.large]
    with pytest.raises(ValueError, match="each tier"):
        train(only_small, synthetic_embeddings(only_small, signal=0.0))
