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
