"""`fleetgate tier calibrate` on the shipped artifact's out-of-sample scores (no model needed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from fleetgate.cli import main
from fleetgate.router.tiers.calibration import routing_metrics
from fleetgate.router.tiers.scorer import DEFAULT_ARTIFACT, ScorerArtifact


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    path = tmp_path / "scorer.json"
    shutil.copy(DEFAULT_ARTIFACT, path)
    return path


def test_calibrate_prints_a_snippet_for_a_target_share(artifact: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = artifact.read_bytes()
    assert main(["tier", "calibrate", "--target-share", "0.5", "--artifact", str(artifact)]) == 0
    out = capsys.readouterr().out
    assert "threshold:" in out
    share = float(out.split("share to large tier")[1].split()[0])
    assert share == pytest.approx(0.5, abs=1 / len(ScorerArtifact.load(artifact).labels))
    assert artifact.read_bytes() == before  # nothing written without --write


@pytest.mark.parametrize("model", ["full", "structural"])
def test_calibrate_write_sets_the_threshold_for_the_share(artifact: Path, model: str) -> None:
    assert main(["tier", "calibrate", "--target-share", "0.6", "--model", model, "--artifact", str(artifact),
                 "--write"]) == 0
    saved = ScorerArtifact.load(artifact)
    m = getattr(saved, model)
    share = routing_metrics(np.asarray(m.oos_scores), np.asarray(saved.labels), threshold=m.threshold).share_large
    assert share == pytest.approx(0.6, abs=1 / len(saved.labels))


def test_calibrate_for_recall_and_budget(artifact: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tier", "calibrate", "--target-recall", "0.99", "--artifact", str(artifact), "--write"]) == 0
    saved = ScorerArtifact.load(artifact)
    y = np.asarray(saved.labels)
    assert routing_metrics(np.asarray(saved.full.oos_scores), y, threshold=saved.full.threshold).recall_large >= 0.99
    capsys.readouterr()
    assert main(["tier", "calibrate", "--budget", "0.5", "--artifact", str(artifact)]) == 0
    out = capsys.readouterr().out
    assert "budget 0.50 x always-large" in out
    savings = float(out.split("savings vs always-large ")[1].split("%")[0])
    assert savings >= 49.0  # half the always-large spend, or less (one row of rounding aside)


def test_calibrate_reads_prices_from_a_gateway_config(artifact: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "tiers:\n  aliases:\n    auto:\n      tiers:\n"
        "        - {name: s, model: a, relative_cost: 1}\n        - {name: l, model: b, relative_cost: 1}\n"
    )
    args = ["tier", "calibrate", "--target-share", "0.4", "--artifact", str(artifact), "--config", str(config)]
    assert main(args) == 0
    assert "savings vs always-large 0.0%" in capsys.readouterr().out  # equal prices: routing saves nothing
    assert main([*args, "--alias", "nope"]) == 2


def test_calibrate_for_recall_with_confidence_keeps_the_margin(artifact: Path) -> None:
    from fleetgate.router.tiers.calibration import allowed_misses

    assert main(["tier", "calibrate", "--target-recall", "0.95", "--confidence", "0.99", "--artifact", str(artifact),
                 "--write"]) == 0
    saved = ScorerArtifact.load(artifact)
    y = np.asarray(saved.labels)
    n = int(y.sum())
    recall = routing_metrics(np.asarray(saved.full.oos_scores), y, threshold=saved.full.threshold).recall_large
    assert recall >= 1 - allowed_misses(n=n, target=0.95, confidence=0.99) / n > 0.95


def test_train_on_several_files_records_each_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from fleetgate.router.tiers import cli
    from fleetgate.router.tiers.data import DEFAULT_TRAIN, load_labelled
    from fleetgate.router.tiers.embedding import EMBEDDING_DIM
    from fleetgate.router.tiers.training import data_fingerprint

    def fake_embed(rows: list) -> np.ndarray:  # a learnable stand-in for MiniLM: the label shifts one axis
        rng = np.random.default_rng(0)
        out = rng.normal(size=(len(rows), EMBEDDING_DIM))
        out[:, 0] += np.asarray([3.0 if r.large else -3.0 for r in rows])
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    monkeypatch.setattr(cli, "_embed", fake_embed)
    every = load_labelled(DEFAULT_TRAIN)
    files = []
    for name, part in (("a.jsonl", every[::4][:120]), ("b.jsonl", every[1::4][:80])):  # both tiers in each
        path = tmp_path / name
        path.write_text("".join(json.dumps({"id": r.id, "prompt": r.text, "tier": "large" if r.large else "small"})
                                + "\n" for r in part))
        files.append(path)
    out = tmp_path / "scorer.json"
    assert main(["tier", "train", "--data", *map(str, files), "--out", str(out), "--folds", "3"]) == 0
    assert "trained on 200 rows of a.jsonl (120) + b.jsonl (80)" in capsys.readouterr().out
    meta = ScorerArtifact.load(out).meta
    assert [(s["name"], s["rows"]) for s in meta["sources"]] == [("a.jsonl", 120), ("b.jsonl", 80)]
    assert meta["sources"][1]["data_sha256"] == data_fingerprint(load_labelled(files[1]))
    assert (meta["target_recall"], meta["confidence"]) == (0.95, 0.99)


def test_train_on_one_tier_only_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from fleetgate.router.tiers import cli

    monkeypatch.setattr(cli, "_embed", lambda rows: np.ones((len(rows), 384)) / np.sqrt(384))  # no MiniLM needed
    data = tmp_path / "small_only.jsonl"
    data.write_text('{"id": "1", "prompt": "hi", "tier": "small"}\n{"id": "2", "prompt": "hello", "tier": "small"}\n')
    assert main(["tier", "train", "--data", str(data), "--out", str(tmp_path / "s.json")]) == 2
    assert "need at least 5 prompts of each tier" in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()
